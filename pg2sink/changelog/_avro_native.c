/*
 * pg2sink.changelog._avro_native: one pgoutput Insert/Update straight to the Kafka
 * sink's Confluent-framed Avro key and value, in one C call per change.
 *
 * Role: the Kafka sink's hot path. The Python path decodes each column's text into a
 * Python value (typemap), builds a Modification, then writes the Avro envelope and key
 * from those values (avro.TableEncoder): about 7 us of interpreter work per change. The
 * text PostgreSQL sends already holds everything the Avro bytes need, so this module
 * walks the message's new TupleData once and writes the bytes directly.
 *
 * Contract: the output is byte for byte what TableEncoder.encode_value/encode_key give
 * (with the wire headers) for the same change; tests/changelog/test_avro_native.py checks
 * it against the Python path on values a real PostgreSQL sent. Whatever this code does
 * not handle exactly (an old tuple, a binary value, a text form it
 * does not expect, a value outside its Avro type) makes it return None: "decline", and
 * the caller takes the Python path, which writes the record or reports the problem. It
 * never raises for a value, only for a `data` that is not bytes.
 *
 * A RowEncoder is made once per table shape by avro_native.py from the table's Avro row
 * record: one kind per column (see Kind), the key's column order, the wire headers. Its
 * `encode` is a C method, so a change costs no Python frame of its own.
 *
 * The text forms parsed here are those of pg2sink's replication session
 * (config.REPLICATION_SESSION_SETTINGS: DateStyle=ISO, TimeZone=UTC,
 * extra_float_digits=3, bytea_output=hex); anything else declines.
 *
 * Layouts: TupleData in pg2sink/logical/decoder.py; Avro binary encoding in
 * https://avro.apache.org/docs/1.11.1/specification/#binary-encoding (zig-zag varints,
 * length-prefixed bytes/strings, a union as its branch index then the value).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>

#include <stdint.h>
#include <string.h>

#include "_native.h"

/* Column kinds; the numbers are avro_native.py's Kind values. */
enum Kind {
    K_BOOLEAN = 1,     /* boolean: 't' / 'f' */
    K_INT = 2,         /* int: int2, int4 (decimal text) */
    K_LONG = 3,        /* long: int8, oid, xid, cid */
    K_STRING = 4,      /* string: the text unchanged (valid UTF-8) */
    K_BYTES = 5,       /* bytes: bytea's '\x' hex text */
    K_FLOAT = 6,       /* float: float4 */
    K_DOUBLE = 7,      /* double: float8 */
    K_DECIMAL = 8,     /* bytes decimal(p,s): numeric(p,s) */
    K_DATE = 9,        /* int date: 'YYYY-MM-DD' */
    K_TIME = 10,       /* long time-micros: 'HH:MM:SS[.f]' */
    K_TIMESTAMP = 11,  /* long local-timestamp-micros: 'YYYY-MM-DD HH:MM:SS[.f]' */
    K_TIMESTAMPTZ = 12, /* long timestamp-micros: the same, then '+00' */
    K_NUMERIC = 13,     /* string: an unconstrained numeric's text, checked */
    K_ARRAY = 14        /* array of ["null", item]: a one-dimensional array_out text */
};

typedef struct {
    int kind;
    int item;      /* K_ARRAY only: the kind of the elements (not a string kind) */
    int precision; /* K_DECIMAL only (or an array of it) */
    int scale;     /* K_DECIMAL only, 0 <= scale */
    uint64_t bound; /* K_DECIMAL only: 10^max(precision, 1), 0 from 19 digits on */
    const char *field; /* the Avro string of the field's name (for unchanged_toast) */
    Py_ssize_t field_n;
} Column;

/* --- output buffer ------------------------------------------------------------------
 * One growing buffer for the whole module: every call holds the GIL and runs no Python
 * code between its first write to the buffer and its last read (the result tuple, whose
 * allocation may run the garbage collector and so finalizers, comes after), so no two
 * calls ever use it at once. */

static char *out_buf = NULL;
static size_t out_cap = 0;

static int
reserve(size_t need)
{
    if (need <= out_cap)
        return 0;
    size_t cap = out_cap ? out_cap : 4096;
    while (cap < need)
        cap *= 2;
    char *p = PyMem_Realloc(out_buf, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out_buf = p;
    out_cap = cap;
    return 0;
}

/* Avro long: zig-zag, then 7 bits per byte, low first. At most 10 bytes. */
static inline size_t
put_long(char *p, int64_t n)
{
    uint64_t zz = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    size_t i = 0;
    while (zz >= 0x80) {
        p[i++] = (char)((zz & 0x7F) | 0x80);
        zz >>= 7;
    }
    p[i++] = (char)zz;
    return i;
}

/* --- text parsers: each returns 0 and the value, or -1 to decline ------------------- */

/* int2/int4/int8out: an optional '-' and digits. */
static int
parse_int64(const char *s, Py_ssize_t n, int64_t *out)
{
    Py_ssize_t i = 0;
    int neg = 0;
    if (n > 0 && s[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i == n || n - i > 19)
        return -1;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (!is_digit(s[i]))
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0'); /* 19 digits cannot wrap a uint64 */
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return -1;
        *out = (int64_t)(0 - v);
    }
    else {
        if (v > (uint64_t)INT64_MAX)
            return -1;
        *out = (int64_t)v;
    }
    return 0;
}

static int
is_leap(int y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (as Python's date
 * and PostgreSQL count); H. Hinnant's days_from_civil. */
static int64_t
days_from_civil(int y, int m, int d)
{
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* DateStyle=ISO: 'YYYY-MM-DD' for years 1..9999 AD; BC ('... BC'), years above 9999 and
 * infinity have other lengths or forms and decline (Python writes them as strings). */
static int
parse_date(const char *s, Py_ssize_t n, int64_t *days)
{
    static const int month_days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (n != 10 || s[4] != '-' || s[7] != '-')
        return -1;
    int y = digits(s, 4), m = digits(s + 5, 2), d = digits(s + 8, 2);
    if (y < 1 || m < 1 || m > 12 || d < 1)
        return -1;
    if (d > month_days[m - 1] + (m == 2 && is_leap(y)))
        return -1;
    *days = days_from_civil(y, m, d);
    return 0;
}

/* time_out: 'HH:MM:SS', then '.' and 1 to 6 digits (trailing zeros dropped) when the
 * seconds have a fraction. '24:00:00' declines (Python has no such time). */
static int
parse_time(const char *s, Py_ssize_t n, int64_t *micros)
{
    if (n < 8 || s[2] != ':' || s[5] != ':')
        return -1;
    int h = digits(s, 2), m = digits(s + 3, 2), sec = digits(s + 6, 2);
    if (h < 0 || h > 23 || m < 0 || m > 59 || sec < 0 || sec > 59)
        return -1;
    int64_t frac = 0;
    if (n > 8) {
        Py_ssize_t f = n - 9;
        if (s[8] != '.' || f < 1 || f > 6)
            return -1;
        int v = digits(s + 9, (int)f);
        if (v < 0)
            return -1;
        frac = v;
        for (Py_ssize_t i = f; i < 6; i++)
            frac *= 10;
    }
    *micros = ((int64_t)(h * 60 + m) * 60 + sec) * 1000000 + frac;
    return 0;
}

/* 'YYYY-MM-DD HH:MM:SS[.f]': microseconds since 1970-01-01 00:00:00. */
static int
parse_timestamp(const char *s, Py_ssize_t n, int64_t *micros)
{
    int64_t days, tod;
    if (n < 19 || s[10] != ' ')
        return -1;
    if (parse_date(s, 10, &days) < 0 || parse_time(s + 11, n - 11, &tod) < 0)
        return -1;
    *micros = days * 86400 * 1000000 + tod;
    return 0;
}

/* Strict UTF-8, as bytes.decode() checks it: no overlong forms, no surrogates, nothing
 * above U+10FFFF. */
static int
valid_utf8(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        /* ASCII runs 8 bytes at a time: most text is ASCII */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t len;
        unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0; /* overlong */
            else if (c == 0xED)
                hi = 0x9F; /* surrogates */
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90; /* overlong */
            else if (c == 0xF4)
                hi = 0x8F; /* above U+10FFFF */
        }
        else
            return -1;
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi)
            return -1;
        for (Py_ssize_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return -1;
        i += len;
    }
    return 0;
}

/* numeric_out's text: '-'? ('0' | [1-9][0-9]*) ('.' [0-9]+)?, or NaN, Infinity,
 * -Infinity. The Python path writes format(Decimal(text), "f"), which is this text
 * again; other texts Decimal accepts ('1e5', '007', ' 1') it would rewrite or reject. */
static int
valid_numeric_text(const char *s, Py_ssize_t n)
{
    if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0) ||
        (n == 9 && memcmp(s, "-Infinity", 9) == 0))
        return 0;
    Py_ssize_t i = (n > 0 && s[0] == '-') ? 1 : 0;
    if (i == n || !is_digit(s[i]) || (s[i] == '0' && i + 1 < n && s[i + 1] != '.'))
        return -1;
    while (i < n && is_digit(s[i]))
        i++;
    if (i == n)
        return 0;
    if (s[i] != '.' || i + 1 == n)
        return -1;
    for (i++; i < n; i++)
        if (!is_digit(s[i]))
            return -1;
    return 0;
}

static inline int
hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* float4out/float8out with extra_float_digits=3: the shortest text that reads back
 * exactly, or NaN, Infinity, -Infinity. Read with PyOS_string_to_double, the function
 * float() itself uses (correctly rounded, locale-independent), so the double is the one
 * the Python path packs. */
static int
parse_double(const char *s, Py_ssize_t n, double *out)
{
    char buf[64];
    if (n < 1 || n >= (Py_ssize_t)sizeof(buf))
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        /* digits, sign, point, exponent, and the letters of NaN/Infinity only: float()
         * also takes spaces and underscores, which PostgreSQL never prints */
        if (!(is_digit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' ||
              c == 'N' || c == 'a' || c == 'I' || c == 'n' || c == 'f' || c == 'i' ||
              c == 't' || c == 'y'))
            return -1;
    }
    memcpy(buf, s, (size_t)n);
    buf[n] = '\0';
    char *end = NULL;
    double v = PyOS_string_to_double(buf, &end, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (end != buf + n)
        return -1;
    *out = v;
    return 0;
}

/* numeric_out of a numeric(p,s) value: '-'? digits ('.' digits)?, as the unscaled
 * integer of Avro decimal(precision, scale). Declines what the Python path would not
 * write as a decimal (NaN, Infinity: the "string" branch; more non-zero decimals than
 * the scale or more digits than the precision: an error) and what does not fit int64. */
static int
parse_decimal(const char *s, Py_ssize_t n, const Column *col, int64_t *out)
{
    const int scale = col->scale;
    Py_ssize_t i = 0;
    int neg = 0;
    if (n > 0 && s[0] == '-') {
        neg = 1;
        i = 1;
    }
    const uint64_t limit = (uint64_t)INT64_MAX + (uint64_t)neg;
    uint64_t v = 0;
    Py_ssize_t start = i;
    for (; i < n && is_digit(s[i]); i++) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s[i] - '0', &v))
            return -1;
    }
    if (i == start)
        return -1;
    int decimals = 0;
    if (i < n) {
        if (s[i] != '.' || i + 1 == n)
            return -1;
        for (i++; i < n; i++) {
            if (!is_digit(s[i]))
                return -1;
            if (decimals < scale) {
                if (__builtin_mul_overflow(v, 10, &v) ||
                    __builtin_add_overflow(v, s[i] - '0', &v))
                    return -1;
                decimals++;
            }
            else if (s[i] != '0')
                return -1; /* would need rounding */
        }
    }
    for (; decimals < scale; decimals++)
        if (__builtin_mul_overflow(v, 10, &v))
            return -1;
    if (v > limit)
        return -1;
    /* |unscaled| < 10^precision (at least 10); from 19 digits on any int64 is below */
    if (col->bound && v >= col->bound)
        return -1;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* The unscaled value as Python's n.to_bytes((n.bit_length() + 8) // 8, 'big',
 * signed=True) writes it (bit_length of |n|). Returns the number of bytes (1..9). */
static int
put_decimal_bytes(unsigned char *p, int64_t n)
{
    uint64_t mag = n < 0 ? 0 - (uint64_t)n : (uint64_t)n;
    int bits = mag ? 64 - __builtin_clzll(mag) : 0;
    int len = (bits + 8) / 8;
    for (int k = 0; k < len; k++) {
        int shift = 8 * (len - 1 - k);
        p[k] = shift >= 64 ? (n < 0 ? 0xFF : 0x00) : (unsigned char)((uint64_t)n >> shift);
    }
    return len;
}

/* --- one column value: its Avro union branch 1 (byte 2) and the value -------------- */

/* The Avro int/long of the kinds stored as one: 0 and the value, or -1 to decline. */
static int
long_value(int kind, const char *s, Py_ssize_t n, int64_t *v)
{
    switch (kind) {
    case K_INT:
        return parse_int64(s, n, v) < 0 || *v < INT32_MIN || *v > INT32_MAX ? -1 : 0;
    case K_LONG:
        return parse_int64(s, n, v);
    case K_DATE:
        return parse_date(s, n, v);
    case K_TIME:
        return parse_time(s, n, v);
    case K_TIMESTAMP:
        return parse_timestamp(s, n, v);
    case K_TIMESTAMPTZ:
        /* TimeZone=UTC: every value ends in '+00' */
        if (n < 3 || memcmp(s + n - 3, "+00", 3) != 0)
            return -1;
        return parse_timestamp(s, n - 3, v);
    default:
        return -1;
    }
}

/* Worst-case bytes of a column's encoding, beyond its text length: branch, a 10-byte
 * length varint, 8 bytes of double, 9 of decimal. */
#define VALUE_SLACK 32
/* An array's encoding is at most ARRAY_FACTOR times its text (plus VALUE_SLACK): per
 * element of at least 2 bytes of text ('1,'), at most 12 bytes beyond its text. */
#define ARRAY_FACTOR 8

static Py_ssize_t put_value(char *p, const Column *col, const char *s, Py_ssize_t n);

/* The next element of a one-dimensional array_out text s[0:n] from *pos (just after '{'
 * or a ','): its text at *elem, *elem_n, whether it is NULL, and *pos just after the ','
 * or the closing '}'. Returns 1 after the last element, 0 before another, -1 to decline.
 *
 * array_out quotes an element holding white space (timestamps), a quote, a backslash,
 * a delimiter or a brace, or spelling NULL; only quoted elements without backslash are
 * taken (the element types here never need one), anything else declines: several
 * dimensions ('{{'), a lower-bound decoration ('[0:1]={...}'), white space outside quotes.
 * https://www.postgresql.org/docs/current/arrays.html#ARRAYS-IO */
static int
next_element(const char *s, Py_ssize_t n, Py_ssize_t *pos, const char **elem,
             Py_ssize_t *elem_n, int *is_null)
{
    Py_ssize_t i = *pos, start, end;
    *is_null = 0;
    if (i < n && s[i] == '"') {
        start = ++i;
        while (i < n && s[i] != '"') {
            if (s[i] == '\\')
                return -1;
            i++;
        }
        if (i >= n)
            return -1;
        end = i++;
    }
    else {
        start = i;
        while (i < n && s[i] != ',' && s[i] != '}') {
            char c = s[i];
            if (c == '"' || c == '{' || c == '\\' || c == ' ' || c == '\t' || c == '\n' ||
                c == '\r' || c == '\v' || c == '\f')
                return -1;
            i++;
        }
        end = i;
        if (end == start)
            return -1; /* '{,}' or '{1,}': Python rejects an empty element */
        /* an unquoted NULL, in any letter case, is a NULL element */
        *is_null = end - start == 4 && (s[start] | 0x20) == 'n' &&
                   (s[start + 1] | 0x20) == 'u' && (s[start + 2] | 0x20) == 'l' &&
                   (s[start + 3] | 0x20) == 'l';
    }
    if (i >= n)
        return -1;
    *elem = s + start;
    *elem_n = end - start;
    *pos = i + 1;
    if (s[i] == '}')
        return i + 1 == n ? 1 : -1;
    return s[i] == ',' ? 0 : -1;
}

/* An array column's value after its union branch: Avro blocks as TableEncoder writes
 * them, one block of all elements (count, then each as ["null", item]: 0, or 2 and the
 * item), then the closing 0; an empty array is the closing 0 alone. */
static Py_ssize_t
put_array(char *p, const Column *col, const char *s, Py_ssize_t n)
{
    const Column item = {.kind = col->item,
                         .precision = col->precision,
                         .scale = col->scale,
                         .bound = col->bound};
    char *q = p;
    if (n < 2 || s[0] != '{' || s[n - 1] != '}')
        return -1;
    if (n > 2) {
        /* first pass: the element count, which precedes the elements */
        Py_ssize_t count = 0, pos = 1, elem_n;
        const char *elem;
        int is_null, more;
        do {
            more = next_element(s, n, &pos, &elem, &elem_n, &is_null);
            if (more < 0)
                return -1;
            count++;
        } while (more == 0);
        q += put_long(q, count);
        pos = 1;
        do {
            more = next_element(s, n, &pos, &elem, &elem_n, &is_null);
            if (is_null) {
                *q++ = 0;
            }
            else {
                Py_ssize_t w = put_value(q, &item, elem, elem_n); /* not an array */
                if (w < 0)
                    return -1;
                q += w;
            }
        } while (more == 0);
    }
    *q++ = 0;
    return q - p;
}

/* Writes the encoding of a non-null text value at p: union branch 1, then the value.
 * Returns its length or -1 to decline. The buffer has room for n + VALUE_SLACK bytes
 * (n * ARRAY_FACTOR + VALUE_SLACK for an array). */
static Py_ssize_t
put_value(char *p, const Column *col, const char *s, Py_ssize_t n)
{
    int64_t v;
    double d;
    char *q = p;
    *q++ = 2; /* union branch 1: T (["null", T] or ["null", T, "string"]) */
    switch (col->kind) {
    case K_BOOLEAN:
        if (n != 1 || (s[0] != 't' && s[0] != 'f'))
            return -1;
        *q++ = s[0] == 't';
        break;
    case K_INT:
    case K_LONG:
    case K_DATE:
    case K_TIME:
    case K_TIMESTAMP:
    case K_TIMESTAMPTZ:
        if (long_value(col->kind, s, n, &v) < 0)
            return -1;
        q += put_long(q, v);
        break;
    case K_NUMERIC:
        if (valid_numeric_text(s, n) < 0)
            return -1;
        q += put_long(q, n);
        memcpy(q, s, (size_t)n);
        q += n;
        break;
    case K_STRING:
        if (valid_utf8((const unsigned char *)s, n) < 0)
            return -1;
        q += put_long(q, n);
        memcpy(q, s, (size_t)n);
        q += n;
        break;
    case K_BYTES: {
        /* bytea_output=hex: '\x' then two hex digits per byte */
        if (n < 2 || s[0] != '\\' || s[1] != 'x' || (n & 1))
            return -1;
        Py_ssize_t len = (n - 2) / 2;
        q += put_long(q, len);
        for (Py_ssize_t k = 0; k < len; k++) {
            int h = hex_value((unsigned char)s[2 + 2 * k]);
            int l = hex_value((unsigned char)s[3 + 2 * k]);
            if (h < 0 || l < 0)
                return -1;
            *q++ = (char)(h << 4 | l);
        }
        break;
    }
    case K_FLOAT:
    case K_DOUBLE: {
        /* struct.pack('<f' or '<d', float(text)): PyFloat_Pack4/8 are what struct calls,
         * Pack4's overflow check included */
        const int size = col->kind == K_FLOAT ? 4 : 8;
        if (parse_double(s, n, &d) < 0 ||
            (size == 4 ? PyFloat_Pack4(d, q, 1) : PyFloat_Pack8(d, q, 1)) < 0) {
            PyErr_Clear();
            return -1;
        }
        q += size;
        break;
    }
    case K_DECIMAL: {
        unsigned char bytes[9];
        if (parse_decimal(s, n, col, &v) < 0)
            return -1;
        int len = put_decimal_bytes(bytes, v);
        q += put_long(q, len);
        memcpy(q, bytes, (size_t)len);
        q += len;
        break;
    }
    case K_ARRAY: {
        Py_ssize_t w = put_array(q, col, s, n);
        if (w < 0)
            return -1;
        q += w;
        break;
    }
    default:
        return -1;
    }
    return q - p;
}

/* --- RowEncoder: one table shape's encoder ------------------------------------------ */

typedef struct {
    PyObject_HEAD
    int ready; /* __init__ succeeded */
    Py_ssize_t ncols;
    Py_ssize_t nkey;   /* -1: the table has no key */
    Column *cols;
    Py_ssize_t *key;   /* column index of each key field, in key order */
    Py_ssize_t *spans; /* scratch: start and end of each column's bytes in the value */
    Py_ssize_t *toast; /* scratch: the columns whose value is unchanged TOAST */
    PyObject *fields;  /* tuple of bytes that Column.field points into */
    Py_ssize_t fields_n; /* their total length */
    int text_factor;     /* output bytes per text byte at most: ARRAY_FACTOR with arrays */
    PyObject *key_header;   /* bytes */
    PyObject *value_header; /* bytes */
    PyObject *names;        /* bytes: Avro strings namespace and name */
    PyObject *epoch;        /* datetime 1970-01-01 UTC */
    /* the last change's commit time (a new object per transaction) and its Avro long */
    PyObject *time;
    int64_t time_micros;
    /* the last change's operation and its Avro string */
    PyObject *op;
    char op_bytes[16];
    Py_ssize_t op_n;
} RowEncoder;

static void
RowEncoder_dealloc(RowEncoder *self)
{
    PyMem_Free(self->cols);
    PyMem_Free(self->key);
    PyMem_Free(self->spans);
    PyMem_Free(self->toast);
    Py_XDECREF(self->fields);
    Py_XDECREF(self->key_header);
    Py_XDECREF(self->value_header);
    Py_XDECREF(self->names);
    Py_XDECREF(self->epoch);
    Py_XDECREF(self->time);
    Py_XDECREF(self->op);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
RowEncoder_init(RowEncoder *self, PyObject *args, PyObject *kwds)
{
    PyObject *columns, *key;
    PyObject *key_header, *value_header, *names, *epoch;
    static char *kwlist[] = {"columns", "key", "key_header", "value_header", "names", "epoch",
                             NULL};
    if (self->cols != NULL) {
        PyErr_SetString(PyExc_TypeError, "RowEncoder is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOSSSO:RowEncoder", kwlist, &columns, &key,
                                     &key_header, &value_header, &names, &epoch))
        return -1;
    PyObject *cols_seq = PySequence_Fast(columns, "columns must be a sequence");
    if (cols_seq == NULL)
        return -1;
    PyObject *key_seq = NULL;
    self->ncols = PySequence_Fast_GET_SIZE(cols_seq);
    if (self->ncols > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "too many columns");
        goto fail;
    }
    self->cols = PyMem_Calloc((size_t)self->ncols + 1, sizeof(Column));
    self->spans = PyMem_Calloc(2 * (size_t)self->ncols + 1, sizeof(Py_ssize_t));
    self->toast = PyMem_Calloc((size_t)self->ncols + 1, sizeof(Py_ssize_t));
    self->fields = PyTuple_New(self->ncols);
    if (self->cols == NULL || self->spans == NULL || self->toast == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (self->fields == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        Column *c = &self->cols[i];
        PyObject *field;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(cols_seq, i), "iiiiS", &c->kind,
                              &c->item, &c->precision, &c->scale, &field))
            goto fail;
        PyTuple_SET_ITEM(self->fields, i, Py_NewRef(field));
        c->field = PyBytes_AS_STRING(field);
        c->field_n = PyBytes_GET_SIZE(field);
        self->fields_n += c->field_n;
        /* an array's items: no strings (they need quoting and escapes), no arrays */
        const int item_ok = c->item == 0 ||
                            (c->kind == K_ARRAY && c->item != K_STRING && c->item != K_BYTES &&
                             c->item != K_NUMERIC && c->item >= K_BOOLEAN &&
                             c->item <= K_TIMESTAMPTZ);
        if (c->kind < K_BOOLEAN || c->kind > K_ARRAY || (c->kind == K_ARRAY) != (c->item != 0) ||
            !item_ok || c->scale < 0 || c->precision < 0) {
            PyErr_Format(PyExc_ValueError, "invalid column %zd", i);
            goto fail;
        }
        if (c->kind == K_ARRAY)
            self->text_factor = ARRAY_FACTOR;
        if ((c->kind == K_DECIMAL || c->item == K_DECIMAL) && c->precision < 19) {
            c->bound = 1;
            for (int k = 0; k < (c->precision > 1 ? c->precision : 1); k++)
                c->bound *= 10;
        }
    }
    if (self->text_factor == 0)
        self->text_factor = 1;
    self->nkey = -1;
    if (key != Py_None) {
        key_seq = PySequence_Fast(key, "key must be a sequence or None");
        if (key_seq == NULL)
            goto fail;
        self->nkey = PySequence_Fast_GET_SIZE(key_seq);
        self->key = PyMem_Calloc((size_t)self->nkey + 1, sizeof(Py_ssize_t));
        if (self->key == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t k = 0; k < self->nkey; k++) {
            Py_ssize_t index = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(key_seq, k), NULL);
            if (index == -1 && PyErr_Occurred())
                goto fail;
            if (index < 0 || index >= self->ncols) {
                PyErr_Format(PyExc_ValueError, "key column %zd out of range", index);
                goto fail;
            }
            self->key[k] = index;
        }
    }
    self->key_header = Py_NewRef(key_header);
    self->value_header = Py_NewRef(value_header);
    self->names = Py_NewRef(names);
    self->epoch = Py_NewRef(epoch);
    self->ready = 1;
    Py_DECREF(cols_seq);
    Py_XDECREF(key_seq);
    return 0;
fail:
    /* freed by dealloc; cols stays set so a second __init__ is refused */
    Py_DECREF(cols_seq);
    Py_XDECREF(key_seq);
    return -1;
}

/* The commit time's Avro long (microseconds since the epoch), computed once per
 * transaction as TableEncoder does: (commit_time - epoch) // 1 us, exact. */
static int
commit_micros(RowEncoder *self, PyObject *commit_time, int64_t *out)
{
    if (commit_time == self->time) {
        *out = self->time_micros;
        return 0;
    }
    PyObject *delta = PyNumber_Subtract(commit_time, self->epoch);
    if (delta == NULL)
        return -1;
    if (!PyDelta_Check(delta)) {
        Py_DECREF(delta);
        PyErr_SetString(PyExc_TypeError, "commit time minus epoch is not a timedelta");
        return -1;
    }
    *out = ((int64_t)PyDateTime_DELTA_GET_DAYS(delta) * 86400 +
            PyDateTime_DELTA_GET_SECONDS(delta)) * 1000000 +
           PyDateTime_DELTA_GET_MICROSECONDS(delta);
    Py_DECREF(delta);
    Py_XSETREF(self->time, Py_NewRef(commit_time));
    self->time_micros = *out;
    return 0;
}

/* The operation's Avro string ("INSERT", "UPDATE": Operation is a StrEnum). */
static int
operation_bytes(RowEncoder *self, PyObject *op)
{
    if (op == self->op)
        return 0;
    Py_ssize_t n;
    const char *text = PyUnicode_Check(op) ? PyUnicode_AsUTF8AndSize(op, &n) : NULL;
    if (text == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "the operation must be a str (Operation)");
        return -1;
    }
    if (n > 12) {
        PyErr_SetString(PyExc_ValueError, "operation name too long");
        return -1;
    }
    self->op_n = (Py_ssize_t)put_long(self->op_bytes, n);
    memcpy(self->op_bytes + self->op_n, text, (size_t)n);
    self->op_n += n;
    Py_XSETREF(self->op, Py_NewRef(op));
    return 0;
}

PyDoc_STRVAR(
    encode_doc,
    "encode(data, commit_time, sequence, lsn, xid, op) -> (key | None, value) | None\n\n"
    "data: an Insert or Update message (pgoutput, protocol 1), bytes. value = the value "
    "header and the Modification envelope (timestamp, sequence, lsn, xid, operation, "
    "namespace, name, before = null, after = the new row, unchanged_toast, "
    "truncate = null); key = the key header and the key record, None for a table without "
    "key. None: declined, take the Python path.");

static PyObject *
RowEncoder_encode(RowEncoder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "encode takes 6 arguments");
        return NULL;
    }
    PyObject *data = args[0];
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "encode: data must be bytes");
        return NULL;
    }
    if (!self->ready) {
        PyErr_SetString(PyExc_TypeError, "RowEncoder not initialised");
        return NULL;
    }
    int64_t values[3]; /* sequence, lsn, xid */
    for (int k = 0; k < 3; k++) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(args[2 + k], &overflow);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (overflow)
            Py_RETURN_NONE; /* beyond an Avro long: the Python path says so */
        values[k] = v;
    }
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(data);
    const Py_ssize_t n = PyBytes_GET_SIZE(data);
    /* 'I' or 'U', Int32 relation id, 'N' (an Update with an old tuple has 'K' or 'O'
     * here: declined), Int16 column count */
    if (n < 8 || (s[0] != 'I' && s[0] != 'U') || s[5] != 'N' ||
        (Py_ssize_t)((unsigned)s[6] << 8 | s[7]) != self->ncols)
        Py_RETURN_NONE;
    int64_t micros;
    if (commit_micros(self, args[1], &micros) < 0 || operation_bytes(self, args[5]) < 0) {
        /* not a datetime or not an Operation: the Python path reports it */
        PyErr_Clear();
        Py_RETURN_NONE;
    }

    const Py_ssize_t header_n = PyBytes_GET_SIZE(self->value_header),
                     names_n = PyBytes_GET_SIZE(self->names);
    /* the row's encoding is at most its texts (times the array factor) plus VALUE_SLACK
     * per column */
    if (reserve((size_t)(header_n + 40 + self->op_n + names_n + 2 + n * self->text_factor +
                         VALUE_SLACK * self->ncols + 10 + self->fields_n + 2)) < 0)
        return NULL;
    /* the envelope up to `after`: header, timestamp, sequence, lsn, xid, operation,
     * namespace, name, before = null (branch 0), after = branch 1 */
    char *p = out_buf;
    memcpy(p, PyBytes_AS_STRING(self->value_header), (size_t)header_n);
    p += header_n;
    p += put_long(p, micros);
    p += put_long(p, values[0]);
    p += put_long(p, values[1]);
    p += put_long(p, values[2]);
    memcpy(p, self->op_bytes, (size_t)self->op_n);
    p += self->op_n;
    memcpy(p, PyBytes_AS_STRING(self->names), (size_t)names_n);
    p += names_n;
    *p++ = 0;
    *p++ = 2;

    Py_ssize_t off = 8;
    Py_ssize_t *spans = self->spans;
    Py_ssize_t ntoast = 0;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        if (off >= n)
            Py_RETURN_NONE;
        const unsigned char kind = s[off];
        spans[2 * i] = p - out_buf;
        if (kind == 't') {
            if (off + 5 > n)
                Py_RETURN_NONE;
            const Py_ssize_t len = (Py_ssize_t)be32(s + off + 1);
            const Py_ssize_t start = off + 5;
            if (len > n - start)
                Py_RETURN_NONE;
            const Py_ssize_t w = put_value(p, &self->cols[i], (const char *)s + start, len);
            if (w < 0)
                Py_RETURN_NONE;
            p += w;
            off = start + len;
        }
        else if (kind == 'n') {
            *p++ = 0; /* union branch 0: null */
            off++;
        }
        else if (kind == 'u') {
            /* an unchanged TOASTed value PostgreSQL did not send: null, and the field
             * listed in unchanged_toast (as TableEncoder writes it; a key field too) */
            *p++ = 0;
            self->toast[ntoast++] = i;
            off++;
        }
        else {
            Py_RETURN_NONE; /* 'b' (binary: only if asked for) or anything else */
        }
        spans[2 * i + 1] = p - out_buf;
    }
    if (off != n)
        Py_RETURN_NONE; /* trailing bytes */
    /* unchanged_toast: one block of the field names, if any, then the closing block;
     * truncate: null */
    if (ntoast) {
        p += put_long(p, ntoast);
        for (Py_ssize_t t = 0; t < ntoast; t++) {
            const Column *c = &self->cols[self->toast[t]];
            memcpy(p, c->field, (size_t)c->field_n);
            p += c->field_n;
        }
    }
    *p++ = 0;
    *p++ = 0;

    PyObject *value = PyBytes_FromStringAndSize(out_buf, p - out_buf);
    if (value == NULL)
        return NULL;
    PyObject *key;
    if (self->nkey < 0) {
        key = Py_NewRef(Py_None);
    }
    else {
        /* the key record: the key columns' encodings, copied from the value */
        const Py_ssize_t key_header_n = PyBytes_GET_SIZE(self->key_header);
        Py_ssize_t key_n = key_header_n;
        for (Py_ssize_t k = 0; k < self->nkey; k++) {
            Py_ssize_t c = self->key[k];
            key_n += spans[2 * c + 1] - spans[2 * c];
        }
        key = PyBytes_FromStringAndSize(NULL, key_n);
        if (key == NULL) {
            Py_DECREF(value);
            return NULL;
        }
        char *kp = PyBytes_AS_STRING(key);
        memcpy(kp, PyBytes_AS_STRING(self->key_header), (size_t)key_header_n);
        kp += key_header_n;
        for (Py_ssize_t k = 0; k < self->nkey; k++) {
            Py_ssize_t c = self->key[k];
            Py_ssize_t w = spans[2 * c + 1] - spans[2 * c];
            memcpy(kp, out_buf + spans[2 * c], (size_t)w);
            kp += w;
        }
    }
    PyObject *result = PyTuple_New(2);
    if (result == NULL) {
        Py_DECREF(key);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, key);
    PyTuple_SET_ITEM(result, 1, value);
    return result;
}

static PyMethodDef RowEncoder_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))RowEncoder_encode, METH_FASTCALL, encode_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(RowEncoder_doc,
             "RowEncoder(columns, key, key_header, value_header, names, epoch)\n\n"
             "columns: (kind, precision, scale, Avro string of the field name) per column "
             "of the table, in order (kinds: avro_native.Kind); key: the column index of each key field in key order, or "
             "None for a table without key; key_header, value_header: the wire-format "
             "headers; names: the Avro strings of the namespace and table name; epoch: "
             "datetime(1970, 1, 1, tzinfo=UTC).");

static PyTypeObject RowEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pg2sink.changelog._avro_native.RowEncoder",
    .tp_basicsize = sizeof(RowEncoder),
    .tp_dealloc = (destructor)RowEncoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = RowEncoder_doc,
    .tp_methods = RowEncoder_methods,
    .tp_init = (initproc)RowEncoder_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pg2sink.changelog._avro_native",
    "pgoutput Insert/Update -> Confluent-framed Avro key and value (see avro_native.py).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__avro_native(void)
{
    return module_with_type(&module, &RowEncoderType, "RowEncoder");
}
