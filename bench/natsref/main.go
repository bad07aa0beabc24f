// natsref: a reference NATS JetStream publisher for bench-stream (bench/stream.py
// --nats-reference), to show what a compiled client reaches on the machine at hand.
//
// It does the least of the work pg2sink's NATS sink does, in Go: it streams its slot
// with pgoutput (the options pg2sink sends) and publishes each Insert, Update and Delete
// as one JSON message to <prefix>.<schema>.<table>, with a Nats-Msg-Id of its LSN,
// sequence and subject, awaiting every PubAck with at most 20,000 in flight (pg2sink's
// MAX_IN_FLIGHT). A transaction's end, or the server's position between transactions,
// is confirmed to PostgreSQL once every message before it is acknowledged. Its JSON is
// pg2sink's object with every column value a string: values are not typed (pg2sink maps
// numerics, timestamps, booleans and jsonb), so the bytes on the wire are about the same
// and the client's work per change is less than any real sink's.
//
// --client raw (the default) speaks the protocol itself, as pg2sink's sink does: HPUB
// frames with a reply subject per message, written a buffer at a time, PubAcks counted
// as they arrive. --client nats.go publishes with the NATS client's PublishMsgAsync.
//
// It is not a product: no Schema records, no TOAST, no reconnects, no outage handling.
// After the confirmation of --endpos it stays connected until it is stopped, as pg2sink
// does, so bench-stream times both the same way (until the slot confirms the end).
// NATSREF_CPUPROFILE=<path>: a Go CPU profile of the run, written at SIGTERM.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/nats-io/nats.go"
)

// maxInFlight matches pg2sink's NATS sink (sinks/nats/sink.py MAX_IN_FLIGHT).
const maxInFlight = 20000

type relation struct {
	subject string
	prefix  []byte   // {"kind":"modification","namespace":"<schema>","name":"<table>"
	names   [][]byte // each column's "<name>":
}

// mark: a position to confirm once `count` messages are acknowledged.
type mark struct {
	count int64
	end   pglogrepl.LSN
}

// publisher: publish copies what it needs; acked counts the messages acknowledged with
// none before them missing (an error ends the program).
type publisher interface {
	publish(subject string, msgID, payload []byte)
	acked() int64
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "natsref: "+format+"\n", args...)
	os.Exit(2)
}

// appendString appends s as a JSON string.
func appendString(b []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func appendTuple(b []byte, rel *relation, t *pglogrepl.TupleData) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	for i, c := range t.Columns {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, rel.names[i]...)
		if c.DataType == 't' {
			b = appendString(b, c.Data)
		} else {
			b = append(b, "null"...)
		}
	}
	return append(b, '}')
}

func main() {
	dsn := flag.String("dsn", "", "libpq connection string (replication=database is added)")
	slot := flag.String("slot", "", "pgoutput slot")
	publication := flag.String("publication", "", "publication")
	url := flag.String("url", nats.DefaultURL, "nats-server URL")
	prefix := flag.String("subject-prefix", "", "subject prefix; also the stream's name")
	endpos := flag.String("endpos", "", "LSN to confirm, then idle until stopped")
	client := flag.String("client", "raw", "raw (HPUB frames written in batches, PubAcks "+
		"counted as they arrive: pg2sink's way) or nats.go (PublishMsgAsync)")
	flag.Parse()
	if path := os.Getenv("NATSREF_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fail("%v", err)
		}
		pprof.StartCPUProfile(f)
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM)
		go func() { <-stop; pprof.StopCPUProfile(); f.Close(); os.Exit(0) }()
	}
	end, err := pglogrepl.ParseLSN(*endpos)
	if err != nil || *slot == "" || *prefix == "" || *publication == "" {
		fail("--dsn, --slot, --publication, --subject-prefix and --endpos are required")
	}

	nc, err := nats.Connect(*url)
	if err != nil {
		fail("connect to %s: %v", *url, err)
	}
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(maxInFlight))
	if err != nil {
		fail("jetstream: %v", err)
	}
	_, err = js.AddStream(&nats.StreamConfig{
		Name: *prefix, Subjects: []string{*prefix + ".>"},
		Storage: nats.FileStorage, Duplicates: 2 * time.Minute,
	})
	if err != nil {
		fail("create stream %s: %v", *prefix, err)
	}
	var pub publisher
	switch *client {
	case "raw":
		pub = newRawPublisher(nc.ConnectedUrl())
	case "nats.go":
		pub = newNatsGoPublisher(js)
	default:
		fail("--client: raw or nats.go, not %q", *client)
	}

	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, *dsn+" replication=database")
	if err != nil {
		fail("connect to PostgreSQL: %v", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, *slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + *publication + "'"},
	})
	if err != nil {
		fail("start replication: %v", err)
	}

	relations := map[uint32]*relation{}
	var (
		lastStatus  time.Time
		deadlineSet time.Time
		sent        pglogrepl.LSN
		timestamp   []byte
		xid         uint32
		sequence    int
		buf, id     []byte
		done        bool
		inTxn       bool
		queued      pglogrepl.LSN // the last position waiting for acknowledgements
		published   int64
		marks       []mark // positions waiting for acknowledgements, in order
		confirmed   pglogrepl.LSN
	)
	markAt := func(end pglogrepl.LSN) {
		queued = end
		marks = append(marks, mark{published, end})
	}
	for {
		acked := pub.acked()
		for len(marks) > 0 && marks[0].count <= acked {
			confirmed, marks = marks[0].end, marks[1:]
		}
		// Confirm at most every 10 ms (each is a write to the server), and the end at once.
		now := time.Now()
		if c := confirmed; (c != sent && (now.Sub(lastStatus) > 10*time.Millisecond || c >= end)) ||
			now.Sub(lastStatus) > time.Second {
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: c})
			if err != nil {
				fail("status update: %v", err)
			}
			sent, lastStatus = c, now
		}
		// While a position waits for its acknowledgements, wake often to confirm it
		// (pgconn's connection is not to be written while another goroutine reads it).
		// A read deadline on the socket, moved at most every millisecond: a context with
		// a timeout per message cost more than the parsing (pgconn watches each one).
		if now.Sub(deadlineSet) > time.Millisecond {
			wait := time.Second
			if queued > sent {
				wait = 5 * time.Millisecond
			}
			if err := conn.Conn().SetReadDeadline(now.Add(wait)); err != nil {
				fail("read deadline: %v", err)
			}
			deadlineSet = now
		}
		raw, err := conn.ReceiveMessage(ctx)
		if err != nil {
			if pgconn.Timeout(err) {
				deadlineSet = time.Time{}
				continue
			}
			fail("receive: %v", err)
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok {
			if e, isErr := raw.(*pgproto3.ErrorResponse); isErr {
				fail("server: %s", e.Message)
			}
			continue
		}
		if cd.Data[0] == pglogrepl.PrimaryKeepaliveMessageByteID {
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				fail("keepalive: %v", err)
			}
			// Between transactions, the server's position is confirmed once what was
			// published before it is acknowledged (END may lie past the last commit).
			if !inTxn && ka.ServerWALEnd > queued {
				markAt(ka.ServerWALEnd)
			}
			if ka.ReplyRequested {
				lastStatus = time.Time{} // answer with the next loop's status update
			}
			continue
		}
		if cd.Data[0] != pglogrepl.XLogDataByteID || done {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			fail("xlogdata: %v", err)
		}
		msg, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			fail("pgoutput: %v", err)
		}
		var (
			rel           *relation
			op            string
			before, after *pglogrepl.TupleData
			relID         uint32
		)
		switch m := msg.(type) {
		case *pglogrepl.RelationMessage:
			r := &relation{subject: *prefix + "." + m.Namespace + "." + m.RelationName}
			r.prefix = []byte(`{"kind":"modification","namespace":`)
			r.prefix = appendString(r.prefix, []byte(m.Namespace))
			r.prefix = append(r.prefix, `,"name":`...)
			r.prefix = appendString(r.prefix, []byte(m.RelationName))
			for _, c := range m.Columns {
				r.names = append(r.names, append(appendString(nil, []byte(c.Name)), ':'))
			}
			relations[m.RelationID] = r
			continue
		case *pglogrepl.BeginMessage:
			timestamp = appendString(timestamp[:0], []byte(m.CommitTime.UTC().Format(time.RFC3339Nano)))
			xid, sequence, inTxn = m.Xid, 0, true
			continue
		case *pglogrepl.CommitMessage:
			inTxn = false
			markAt(m.TransactionEndLSN)
			if m.TransactionEndLSN >= end {
				done = true
			}
			continue
		case *pglogrepl.InsertMessage:
			relID, op, after = m.RelationID, "insert", m.Tuple
		case *pglogrepl.UpdateMessage:
			relID, op, before, after = m.RelationID, "update", m.OldTuple, m.NewTuple
		case *pglogrepl.DeleteMessage:
			relID, op, before = m.RelationID, "delete", m.OldTuple
		default:
			continue
		}
		rel = relations[relID]
		if rel == nil {
			fail("change of relation %d before its Relation message", relID)
		}
		sequence++
		lsn := uint64(xld.WALStart)
		buf = append(buf[:0], rel.prefix...)
		buf = append(buf, `,"timestamp":`...)
		buf = append(buf, timestamp...)
		buf = append(buf, `,"sequence":`...)
		buf = strconv.AppendInt(buf, int64(sequence), 10)
		buf = append(buf, `,"lsn":`...)
		buf = strconv.AppendUint(buf, lsn, 10)
		buf = append(buf, `,"xid":`...)
		buf = strconv.AppendUint(buf, uint64(xid), 10)
		buf = append(buf, `,"operation":"`...)
		buf = append(buf, op...)
		buf = append(buf, `","before":`...)
		buf = appendTuple(buf, rel, before)
		buf = append(buf, `,"after":`...)
		buf = appendTuple(buf, rel, after)
		buf = append(buf, '}')

		id = strconv.AppendUint(id[:0], lsn, 10)
		id = append(id, ':')
		id = strconv.AppendInt(id, int64(sequence), 10)
		id = append(id, ':')
		id = append(id, rel.subject...)
		pub.publish(rel.subject, id, buf)
		published++
	}
}

// natsGoPublisher: nats.go's asynchronous JetStream publish, its futures awaited in order.
type natsGoPublisher struct {
	js    nats.JetStreamContext
	queue chan nats.PubAckFuture
	count atomic.Int64
}

func newNatsGoPublisher(js nats.JetStreamContext) *natsGoPublisher {
	p := &natsGoPublisher{js: js, queue: make(chan nats.PubAckFuture, maxInFlight+1024)}
	go func() {
		for f := range p.queue {
			select {
			case <-f.Ok():
				p.count.Add(1)
			case err := <-f.Err():
				fail("publish: %v", err)
			}
		}
	}()
	return p
}

func (p *natsGoPublisher) publish(subject string, msgID, payload []byte) {
	m := nats.NewMsg(subject)
	m.Data = append([]byte(nil), payload...)
	m.Header.Set(nats.MsgIdHdr, string(msgID))
	f, err := p.js.PublishMsgAsync(m)
	if err != nil {
		fail("publish: %v", err)
	}
	p.queue <- f
}

func (p *natsGoPublisher) acked() int64 { return p.count.Load() }

// rawPublisher: the NATS protocol on a connection of its own, as pg2sink's sink speaks
// it: HPUB frames with a reply subject per message into a buffer written when full and
// every millisecond, one subscription to every reply, PubAcks counted as they arrive
// (JetStream answers one connection's messages to one stream in order).
type rawPublisher struct {
	mu      sync.Mutex // the writer: the flusher and the reader's PONG write too
	w       *bufio.Writer
	inbox   string
	serial  int64
	count   atomic.Int64
	scratch []byte
}

func newRawPublisher(url string) *rawPublisher {
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "nats://"))
	if err != nil {
		fail("connect to %s: %v", url, err)
	}
	r := bufio.NewReaderSize(c, 256<<10)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		fail("no INFO from %s: %v", url, err)
	}
	p := &rawPublisher{w: bufio.NewWriterSize(c, 256<<10), inbox: "_INBOX.natsref." + strconv.FormatInt(time.Now().UnixNano(), 36)}
	fmt.Fprintf(p.w, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true,\"protocol\":1}\r\nSUB %s.* 1\r\nPING\r\n", p.inbox)
	if err := p.w.Flush(); err != nil {
		fail("connect: %v", err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "PONG\r\n" {
		fail("connect: %q %v", line, err)
	}
	go p.read(r)
	go func() {
		for range time.Tick(time.Millisecond) {
			p.mu.Lock()
			if p.w.Buffered() > 0 {
				if err := p.w.Flush(); err != nil {
					fail("write: %v", err)
				}
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *rawPublisher) read(r *bufio.Reader) {
	var payload []byte
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			fail("read: %v", err)
		}
		switch {
		case bytes.HasPrefix(line, []byte("MSG ")):
			fields := bytes.Fields(line)
			size, err := strconv.Atoi(string(fields[len(fields)-1]))
			if err != nil {
				fail("MSG line %q", line)
			}
			if cap(payload) < size+2 {
				payload = make([]byte, size+2)
			}
			payload = payload[:size+2]
			if _, err := io.ReadFull(r, payload); err != nil {
				fail("read: %v", err)
			}
			if !bytes.HasPrefix(payload, []byte(`{"stream":`)) {
				fail("publish: %s", payload[:size])
			}
			p.count.Add(1)
		case bytes.HasPrefix(line, []byte("PING")):
			p.mu.Lock()
			p.w.WriteString("PONG\r\n")
			p.w.Flush()
			p.mu.Unlock()
		case bytes.HasPrefix(line, []byte("-ERR")), bytes.HasPrefix(line, []byte("HMSG")):
			fail("server: %s", bytes.TrimSpace(line))
		}
	}
}

func (p *rawPublisher) publish(subject string, msgID, payload []byte) {
	for p.serial-p.count.Load() >= maxInFlight { // room: as pg2sink's MAX_IN_FLIGHT
		time.Sleep(100 * time.Microsecond)
	}
	const head = "NATS/1.0\r\nNats-Msg-Id: "
	hdr := len(head) + len(msgID) + 4
	b := append(p.scratch[:0], "HPUB "...)
	b = append(b, subject...)
	b = append(b, ' ')
	b = append(b, p.inbox...)
	b = append(b, '.')
	b = strconv.AppendInt(b, p.serial, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(hdr), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(hdr+len(payload)), 10)
	b = append(b, "\r\n"+head...)
	b = append(b, msgID...)
	b = append(b, "\r\n\r\n"...)
	b = append(b, payload...)
	b = append(b, "\r\n"...)
	p.scratch = b
	p.serial++
	p.mu.Lock()
	_, err := p.w.Write(b)
	p.mu.Unlock()
	if err != nil {
		fail("write: %v", err)
	}
}

func (p *rawPublisher) acked() int64 { return p.count.Load() }
