// kinesalite on loopback only: its own CLI listens on every interface.
// Usage: node server.js KINESALITE_DIR PORT OPTIONS_JSON
// OPTIONS_JSON is kinesalite's options object ({"path": ..., "createStreamMs": ...}).
'use strict'

const [moduleDir, port, options] = process.argv.slice(2)
const kinesalite = require(moduleDir)
const server = kinesalite(JSON.parse(options)).listen(Number(port), '127.0.0.1', () => {
  const address = server.address()
  // scripts/services.py waits for this line
  console.log('kinesalite listening at http://%s:%s', address.address, address.port)
})
// Close LevelDB cleanly so the streams survive a restart, without waiting for
// the keep-alive connections clients hold open.
process.on('SIGTERM', () => {
  server.close(() => process.exit(0))
  server.closeAllConnections()
})
