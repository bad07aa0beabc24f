"""Golden bytes captured from a real PostgreSQL 15.

Captured once from a throwaway server (wal_level=logical); the tests do not need a server.

Schema (run before the slot was created):

    CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');                    -- type oid 16385
    CREATE TABLE users (id int PRIMARY KEY, name text, bio text, m mood, big text);  -- 16391
    ALTER TABLE users ALTER COLUMN big SET STORAGE EXTERNAL;
    CREATE TABLE full_t (id int, v varchar(10));                        -- 16398
    ALTER TABLE full_t REPLICA IDENTITY FULL;
    CREATE TABLE a (id serial PRIMARY KEY);                             -- 16402
    CREATE TABLE b (id int PRIMARY KEY, aid int REFERENCES a);          -- 16408
    CREATE TABLE six (c1 text, c2 text, c3 text, c4 text, c5 text, c6 text);  -- 16418
    CREATE TABLE big (id int, payload text);                            -- 16423
    CREATE TABLE bigm (id int, m mood, payload text);                   -- 16436
    CREATE PUBLICATION pub FOR ALL TABLES;
    SELECT pg_create_logical_replication_slot('golden', 'pgoutput');

pgoutput messages were read with

    SELECT lsn, data FROM pg_logical_slot_peek_binary_changes('golden', NULL, NULL,
        'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')

(plus 'binary', 'true' for the *_BINARY constants), and the streamed ones from slots created
just before the large transactions, with `SET logical_decoding_work_mem = '64kB'` (the default
is 64MB) and options 'proto_version', '2', 'streaming', 'on'. The replication frames were read
by a raw protocol client after
START_REPLICATION SLOT golden LOGICAL 0/0 (proto_version '1', publication_names 'pub').
"""

from __future__ import annotations

from typing import Final

USERS_OID: Final = 16391
MOOD_OID: Final = 16385
FULL_T_OID: Final = 16398
A_OID: Final = 16402
B_OID: Final = 16408
SIX_OID: Final = 16418
BIG_OID: Final = 16423
BIGM_OID: Final = 16436

# -- INSERT INTO users (id, name, bio, m, big) VALUES (1, 'Zoë', NULL, 'happy', repeat('x', 3000));
BEGIN: Final = bytes.fromhex("420000000001544c38000303bee9bc4980000002de")
TYPE_MOOD: Final = bytes.fromhex("59000040017075626c6963006d6f6f6400")
RELATION_USERS: Final = bytes.fromhex(
    "52000040077075626c6963007573657273006400050169640000000017ffffffff006e616d650000000019"
    "ffffffff0062696f0000000019ffffffff006d0000004001ffffffff006269670000000019ffffffff"
)
# the captured message ends with the 3000 bytes of repeat('x', 3000), spelled out here
INSERT_USERS: Final = (
    bytes.fromhex("49000040074e000574000000013174000000045a6fc3ab6e740000000568617070797400000bb8")
    + b"x" * 3000
)
COMMIT: Final = bytes.fromhex("43000000000001544c380000000001544c68000303bee9bc4980")

# -- UPDATE users SET name = 'Zoe' WHERE id = 1;  (no old tuple; 'big' is an unchanged TOAST)
UPDATE_NO_OLD: Final = bytes.fromhex(
    "55000040074e000574000000013174000000035a6f656e7400000005686170707975"
)
# -- UPDATE users SET id = 2 WHERE id = 1;  (key changed: 'K' old key tuple)
UPDATE_KEY: Final = bytes.fromhex(
    "55000040074b00057400000001316e6e6e6e4e000574000000013274000000035a6f656e7400000005686170707975"
)
# -- DELETE FROM users WHERE id = 2;
DELETE_KEY: Final = bytes.fromhex("44000040074b00057400000001326e6e6e6e")

# full_t has REPLICA IDENTITY FULL: every column is flagged key, varchar(10) has typmod 14
RELATION_FULL_T: Final = bytes.fromhex(
    "520000400e7075626c69630066756c6c5f74006600020169640000000017ffffffff017600000004130000000e"
)
# -- INSERT INTO full_t VALUES (1, 'a');
INSERT_FULL_T: Final = bytes.fromhex("490000400e4e0002740000000131740000000161")
# -- UPDATE full_t SET v = 'b' WHERE id = 1;  ('O' full old row)
UPDATE_OLD: Final = bytes.fromhex(
    "550000400e4f00027400000001317400000001614e0002740000000131740000000162"
)
# -- DELETE FROM full_t WHERE id = 1;
DELETE_OLD: Final = bytes.fromhex("440000400e4f0002740000000131740000000162")

# -- TRUNCATE a, b RESTART IDENTITY CASCADE;
RELATION_A: Final = bytes.fromhex("52000040127075626c69630061006400010169640000000017ffffffff")
RELATION_B: Final = bytes.fromhex(
    "52000040187075626c69630062006400020169640000000017ffffffff006169640000000017ffffffff"
)
TRUNCATE_CASCADE_RESTART: Final = bytes.fromhex("5400000002030000401200004018")
# -- TRUNCATE full_t;
TRUNCATE_PLAIN: Final = bytes.fromhex("5400000001000000400e")

# -- SELECT pg_logical_emit_message(true, 'x', 'hello');
MESSAGE_TRANSACTIONAL: Final = bytes.fromhex("4d0100000000015463c878000000000568656c6c6f")
# -- SELECT pg_logical_emit_message(false, 'nt', '\x00ff'::bytea);
MESSAGE_NON_TRANSACTIONAL: Final = bytes.fromhex("4d0000000000015464306e74000000000200ff")

# -- INSERT INTO six VALUES ('alpha', 'bravo', 'charlie', 'delta', 'echo', 'foxtrot');
RELATION_SIX: Final = bytes.fromhex(
    "52000040227075626c696300736978006400060063310000000019ffffffff0063320000000019ffffffff"
    "0063330000000019ffffffff0063340000000019ffffffff0063350000000019ffffffff006336000000"
    "0019ffffffff"
)
INSERT_SIX: Final = bytes.fromhex(
    "49000040224e00067400000005616c7068617400000005627261766f7400000007636861726c6965740000"
    "000564656c746174000000046563686f7400000007666f7874726f74"
)

# -- SELECT pg_replication_origin_create('upstream');
# -- SELECT pg_replication_origin_session_setup('upstream');
# -- BEGIN;
# -- SELECT pg_replication_origin_xact_setup('0/ABCDEF01', '2024-05-01 10:00:00+00');
# -- INSERT INTO full_t VALUES (7, 'o');
# -- COMMIT;
BEGIN_WITH_ORIGIN: Final = bytes.fromhex("4200000000015467680002ba60517a0800000002ea")
ORIGIN: Final = bytes.fromhex("4f00000000abcdef01757073747265616d00")
COMMIT_WITH_ORIGIN: Final = bytes.fromhex("4300000000000154676800000000015467b00002ba60517a0800")

# Same changes, read with 'binary', 'true': tuple kind 'b' (int4 1 is 00000001).
# -- INSERT INTO full_t VALUES (1, 'a');
INSERT_FULL_T_BINARY: Final = bytes.fromhex("490000400e4e0002620000000400000001620000000161")
# -- UPDATE users SET id = 2 WHERE id = 1;  (kinds b, n and u in one message)
UPDATE_KEY_BINARY: Final = bytes.fromhex(
    "55000040074b00056200000004000000016e6e6e6e4e000562000000040000000262000000035a6f656e"
    "6200000005686170707975"
)

# -- Streaming, proto_version 2 (slot created just before this SQL):
# -- BEGIN; INSERT INTO big SELECT g, repeat('p', 100) FROM generate_series(1, 1000) g; COMMIT;
STREAM_START_FIRST: Final = bytes.fromhex("53000002eb01")
STREAM_RELATION_BIG: Final = bytes.fromhex(
    "52000002eb000040277075626c696300626967006400020069640000000017ffffffff007061796c6f61"
    "640000000019ffffffff"
)
# the captured message ends with the 100 bytes of repeat('p', 100), spelled out here
STREAM_INSERT_BIG: Final = (
    bytes.fromhex("49000002eb000040274e00027400000001317400000064") + b"p" * 100
)
STREAM_STOP: Final = bytes.fromhex("45")
STREAM_START_NEXT: Final = bytes.fromhex("53000002eb00")
STREAM_COMMIT: Final = bytes.fromhex("63000002eb00000000000156dab0000000000156dae0000303bee9fa2ab3")
# -- BEGIN; INSERT INTO big SELECT g, repeat('q', 100) FROM generate_series(1, 1000) g; ROLLBACK;
STREAM_ABORT_TOP: Final = bytes.fromhex("41000002ec000002ec")
# -- BEGIN; INSERT INTO big VALUES (0, 'top'); SAVEPOINT s1;
# -- INSERT INTO big SELECT g, repeat('r', 100) FROM generate_series(1, 1000) g;
# -- ROLLBACK TO SAVEPOINT s1; COMMIT;
# (the insert inside the savepoint carries the subtransaction's xid, 750)
STREAM_INSERT_SUBXACT: Final = (
    bytes.fromhex("49000002ee000040274e000274000000033238327400000064") + b"r" * 100
)
STREAM_ABORT_SUBXACT: Final = bytes.fromhex("41000002ed000002ee")
# -- BEGIN;
# -- INSERT INTO bigm SELECT g, 'ok', repeat('s', 100) FROM generate_series(1, 400) g;
# -- SELECT pg_logical_emit_message(true, 'st', 'in-stream');
# -- INSERT INTO bigm SELECT g, 'ok', repeat('s', 100) FROM generate_series(1, 400) g;
# -- TRUNCATE six;
# -- COMMIT;
STREAM_TYPE_MOOD: Final = bytes.fromhex("59000002f0000040017075626c6963006d6f6f6400")
STREAM_MESSAGE: Final = bytes.fromhex(
    "4d000002f00100000000015d178873740000000009696e2d73747265616d"
)
STREAM_TRUNCATE: Final = bytes.fromhex("54000002f0000000010000004022")
# -- BEGIN; INSERT INTO full_t SELECT g, 'x' FROM generate_series(2, 1500) g;
# -- UPDATE full_t SET v = 'y' WHERE id = 2; DELETE FROM full_t WHERE id = 3; COMMIT;
STREAM_UPDATE_OLD: Final = bytes.fromhex(
    "55000002f10000400e4f00027400000001327400000001784e0002740000000132740000000179"
)
STREAM_DELETE_OLD: Final = bytes.fromhex("44000002f10000400e4f0002740000000133740000000178")

# -- Replication CopyData frames (raw protocol client, see the module docstring).
# First frame after START_REPLICATION: a keepalive, no reply requested.
KEEPALIVE: Final = bytes.fromhex("6b0000000001543dc8000303beeae978b400")
# With wal_sender_timeout = '2s' and no feedback sent: reply requested.
KEEPALIVE_REPLY_REQUESTED: Final = bytes.fromhex("6b00000000015fa1a8000303beeb141db201")
# XLogData around the BEGIN above: data_start = wal_end = 0/1544B38.
XLOGDATA_BEGIN: Final = bytes.fromhex(
    "770000000001544b380000000001544b38000303beeae97983420000000001544c38000303bee9bc4980000002de"
)
# XLogData in the middle of a transaction: the server leaves data_start and wal_end at 0.
XLOGDATA_TYPE: Final = bytes.fromhex(
    "7700000000000000000000000000000000000303beeae979a159000040017075626c6963006d6f6f6400"
)
# The Standby status update the capture client sent (write = flush = apply = 0/1544E48,
# send_time 0, reply requested); the server then showed confirmed_flush_lsn 0/1544E48.
STANDBY_STATUS_UPDATE: Final = bytes.fromhex(
    "720000000001544e480000000001544e480000000001544e48000000000000000001"
)


# Stream control messages never carry the extra xid; the other STREAM_* data messages do.
_STREAM_CONTROL: Final = frozenset(
    {
        "STREAM_START_FIRST",
        "STREAM_START_NEXT",
        "STREAM_STOP",
        "STREAM_COMMIT",
        "STREAM_ABORT_TOP",
        "STREAM_ABORT_SUBXACT",
    }
)
_REPLICATION_FRAMES: Final = ("KEEPALIVE", "XLOGDATA", "STANDBY")

#: every pgoutput message above: name -> (bytes, whether to decode it with in_stream=True)
PGOUTPUT_MESSAGES: Final[dict[str, tuple[bytes, bool]]] = {
    name: (value, name.startswith("STREAM_") and name not in _STREAM_CONTROL)
    for name, value in dict(globals()).items()
    if isinstance(value, bytes) and not name.startswith(_REPLICATION_FRAMES)
}
