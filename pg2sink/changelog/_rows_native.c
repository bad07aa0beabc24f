/*
 * pg2sink.changelog._rows_native: the fast row reader of logical/fastpath.py in C.
 *
 * Role: the changelog's hot path for sinks that take records (the file sink, the message
 * sinks). `compile_row_reader` generates a Python function per relation that walks an
 * Insert's or Update's new TupleData and converts each value; `RowReader` does the same
 * walk in C, so a change costs no interpreter work until the sink gets its dict. The
 * Python reader is the reference and the choice is PG2SINK_IMPL's (changelog/_cmodule.py);
 * tests/changelog/test_rows_native.py checks that both give the same result, declines
 * included, on values a real PostgreSQL sent.
 *
 * Contract (the same as the Python reader's): the result is {column: value} for the new
 * row, or None, "decline": anything not handled exactly (another tag or column count, an
 * old tuple, a binary value, trailing or missing bytes, a value its conversion rejects)
 * and the caller takes the general path, which decodes the same bytes again and raises
 * the precise error. It never raises for a value; only for a `data` that is not bytes.
 *
 * Each column has a code (pgvalues.NATIVE_CODES, keyed by the column's converter): the
 * conversions PostgreSQL's text needs in nearly every row are done here, exactly as the
 * converter does them for the common case, and decline for anything else (BC dates,
 * infinity, NaN...); any other converter is called as a Python function (CALL).
 *
 * The text forms are those of pg2sink's replication session (DateStyle=ISO,
 * TimeZone=UTC, extra_float_digits=3, bytea_output=hex). TupleData layout:
 * pg2sink/logical/decoder.py.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <structmember.h>

#include <stdint.h>
#include <string.h>

#include "_native.h"

/* Column codes; the numbers are pgvalues.NativeCode's. */
enum Code {
    C_CALL = 0,        /* the converter itself, a Python call; an exception declines */
    C_TEXT = 1,        /* bytes.decode: strict UTF-8 */
    C_INT = 2,         /* int: an optional '-' and at most 18 digits (else CALL's int) */
    C_BOOL = 3,        /* 't' / 'f' */
    C_NUMBER = 4,      /* JSON form of numeric: JsonNumber(text) if it ends in a digit */
    C_FLOAT = 5,       /* JSON form of float4/8: the same, and '-0' as '-0.0' */
    C_DATE = 6,        /* 'YYYY-MM-DD' */
    C_TIMESTAMP = 7,   /* 'YYYY-MM-DD HH:MM:SS[.ffffff]' */
    C_TIMESTAMPTZ = 8, /* the same, then '+00': an aware datetime in UTC */
    C_LAST = 8
};

typedef struct {
    PyObject_HEAD
    Py_ssize_t count;      /* columns */
    unsigned char head[3]; /* 'N' and the Int16 column count, after the relation id */
    int *codes;
    PyObject **names;      /* the column names (str) */
    PyObject **converters; /* the Python converters, for C_CALL */
} RowReader;

/* pgvalues.JsonNumber, set by install_values: the class and the offset of its slot. */
static PyTypeObject *number_type = NULL;
static Py_ssize_t number_text_offset = 0;
static PyObject *fragment_type = NULL;    /* orjson.Fragment */
static PyObject *fallback_default = NULL; /* jsonenc's Python default */
static PyObject *unchanged_toast = NULL;  /* logical.messages.UNCHANGED_TOAST */
static PyObject *minus_zero = NULL;       /* JsonNumber(b'-0.0') */

static PyObject *
new_number(PyObject *text)
{
    PyObject *number = number_type->tp_alloc(number_type, 0);
    if (number != NULL)
        *(PyObject **)((char *)number + number_text_offset) = Py_NewRef(text);
    return number;
}

/* 'YYYY-MM-DD' at s (n >= 10): 0 and the fields, or -1 to decline (a year beyond 9999
 * or BC has other text, which the converter turns into a PgText) */
static int
parse_date(const char *s, int *y, int *m, int *d)
{
    if (s[4] != '-' || s[7] != '-')
        return -1;
    *y = digits(s, 4);
    *m = digits(s + 5, 2);
    *d = digits(s + 8, 2);
    return (*y < 1 || *m < 1 || *d < 1) ? -1 : 0;
}

/* 'YYYY-MM-DD HH:MM:SS[.f{1,6}]' in exactly n bytes: a datetime with tzinfo tz, or NULL
 * with no exception set to decline (a Python error, e.g. day 31 in April, declines too) */
static PyObject *
parse_timestamp(const char *s, Py_ssize_t n, PyObject *tz)
{
    int y, mo, d;
    if (n < 19 || parse_date(s, &y, &mo, &d) < 0 || s[10] != ' ' || s[13] != ':' || s[16] != ':')
        return NULL;
    int h = digits(s + 11, 2), mi = digits(s + 14, 2), se = digits(s + 17, 2), us = 0;
    if (h < 0 || mi < 0 || se < 0)
        return NULL;
    if (n > 19) {
        Py_ssize_t frac = n - 20;
        if (s[19] != '.' || frac < 1 || frac > 6)
            return NULL;
        us = digits(s + 20, (int)frac);
        if (us < 0)
            return NULL;
        for (Py_ssize_t i = frac; i < 6; i++)
            us *= 10;
    }
    PyObject *value = PyDateTimeAPI->DateTime_FromDateAndTime(y, mo, d, h, mi, se, us, tz,
                                                              PyDateTimeAPI->DateTimeType);
    if (value == NULL)
        PyErr_Clear();
    return value;
}

/* One column's text as its value; NULL with no exception set declines, NULL with an
 * exception set is an error the caller passes on (not an Exception: KeyboardInterrupt). */
static PyObject *
convert(RowReader *self, Py_ssize_t i, const char *s, Py_ssize_t n)
{
    switch (self->codes[i]) {
    case C_TEXT: {
        PyObject *v = PyUnicode_DecodeUTF8(s, n, NULL);
        if (v == NULL)
            PyErr_Clear();
        return v;
    }
    case C_INT: {
        Py_ssize_t j = (n > 0 && s[0] == '-') ? 1 : 0;
        if (j == n || n - j > 18)
            break; /* to the converter: int() takes any length */
        long long v = 0;
        for (; j < n; j++) {
            if (!is_digit(s[j]))
                return NULL;
            v = v * 10 + (s[j] - '0');
        }
        return PyLong_FromLongLong(s[0] == '-' ? -v : v);
    }
    case C_BOOL:
        if (n == 1 && s[0] == 't')
            Py_RETURN_TRUE;
        if (n == 1 && s[0] == 'f')
            Py_RETURN_FALSE;
        return NULL;
    case C_FLOAT:
        if (n == 2 && s[0] == '-' && s[1] == '0')
            return Py_NewRef(minus_zero);
        /* fall through */
    case C_NUMBER: {
        if (n == 0 || !is_digit(s[n - 1]))
            return NULL; /* NaN, Infinity: the converter's PgText */
        PyObject *text = PyBytes_FromStringAndSize(s, n);
        if (text == NULL)
            return NULL;
        PyObject *v = new_number(text);
        Py_DECREF(text);
        return v;
    }
    case C_DATE: {
        int y, m, d;
        if (n != 10 || parse_date(s, &y, &m, &d) < 0)
            return NULL;
        PyObject *v = PyDateTimeAPI->Date_FromDate(y, m, d, PyDateTimeAPI->DateType);
        if (v == NULL)
            PyErr_Clear();
        return v;
    }
    case C_TIMESTAMP:
        return parse_timestamp(s, n, Py_None);
    case C_TIMESTAMPTZ:
        if (n < 3 || memcmp(s + n - 3, "+00", 3) != 0)
            return NULL;
        return parse_timestamp(s, n - 3, PyDateTime_TimeZone_UTC);
    default:
        break;
    }
    /* C_CALL, and what a code passes on: the converter on the value's bytes */
    PyObject *text = PyBytes_FromStringAndSize(s, n);
    if (text == NULL)
        return NULL;
    PyObject *v = PyObject_CallOneArg(self->converters[i], text);
    Py_DECREF(text);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear(); /* as the Python reader's `except Exception: return None` */
    return v;
}

static PyObject *
RowReader_call(RowReader *self, PyObject *args, PyObject *kwargs)
{
    PyObject *data;
    if (!PyArg_UnpackTuple(args, "read", 1, 1, &data))
        return NULL;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "read(data): data must be bytes");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    /* Byte1 tag, Int32 relation id (the caller checked both), then 'N' and the count */
    if (len < 8 || memcmp(p + 5, self->head, 3) != 0)
        Py_RETURN_NONE;
    PyObject *row = _PyDict_NewPresized(self->count);
    if (row == NULL)
        return NULL;
    Py_ssize_t off = 8;
    for (Py_ssize_t i = 0; i < self->count; i++) {
        if (off >= len)
            goto decline;
        PyObject *v;
        unsigned char kind = p[off];
        if (kind == 't') {
            if (len - off < 5)
                goto decline;
            Py_ssize_t n = (Py_ssize_t)be32(p + off + 1);
            Py_ssize_t start = off + 5;
            if (n > len - start)
                goto decline;
            off = start + n;
            v = convert(self, i, (const char *)p + start, n);
            if (v == NULL) {
                if (PyErr_Occurred())
                    goto error;
                goto decline;
            }
        }
        else if (kind == 'n') {
            v = Py_NewRef(Py_None);
            off += 1;
        }
        else if (kind == 'u') {
            v = Py_NewRef(unchanged_toast);
            off += 1;
        }
        else
            goto decline; /* 'b', binary: not in pg2sink's sessions */
        int failed = PyDict_SetItem(row, self->names[i], v);
        Py_DECREF(v);
        if (failed)
            goto error;
    }
    if (off != len)
        goto decline;
    return row;
decline:
    Py_DECREF(row);
    Py_RETURN_NONE;
error:
    Py_DECREF(row);
    return NULL;
}

static void
RowReader_dealloc(RowReader *self)
{
    for (Py_ssize_t i = 0; i < self->count; i++) {
        if (self->names != NULL)
            Py_XDECREF(self->names[i]);
        if (self->converters != NULL)
            Py_XDECREF(self->converters[i]);
    }
    PyMem_Free(self->codes);
    PyMem_Free(self->names);
    PyMem_Free(self->converters);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
RowReader_init(RowReader *self, PyObject *args, PyObject *kwargs)
{
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "O:RowReader", &columns))
        return -1;
    if (number_type == NULL || unchanged_toast == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "RowReader before install_values()");
        return -1;
    }
    PyObject *seq = PySequence_Fast(columns, "columns must be a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > 0xFFFF || self->codes != NULL) {
        PyErr_SetString(PyExc_ValueError, "at most 65535 columns, initialised once");
        Py_DECREF(seq);
        return -1;
    }
    self->codes = PyMem_Calloc(count ? count : 1, sizeof(int));
    self->names = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    self->converters = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    if (self->codes == NULL || self->names == NULL || self->converters == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    self->count = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name, *converter;
        int code;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UiO:column", &name, &code,
                              &converter)) {
            Py_DECREF(seq);
            return -1;
        }
        if (code < 0 || code > C_LAST || !PyCallable_Check(converter)) {
            PyErr_Format(PyExc_ValueError, "column %zd: no code %d or converter", i, code);
            Py_DECREF(seq);
            return -1;
        }
        self->codes[i] = code;
        self->names[i] = Py_NewRef(name);
        self->converters[i] = Py_NewRef(converter);
    }
    Py_DECREF(seq);
    self->head[0] = 'N';
    self->head[1] = (unsigned char)(count >> 8);
    self->head[2] = (unsigned char)(count & 0xFF);
    return 0;
}

PyDoc_STRVAR(RowReader_doc,
             "RowReader(columns)(data) -> {column: value} | None\n\n"
             "columns: (name, code, converter) per column of the relation, in order "
             "(codes: pgvalues.NativeCode); data: an Insert or Update message whose tag and "
             "relation id the caller checked. As logical.fastpath.compile_row_reader's reader.");

static PyTypeObject RowReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pg2sink.changelog._rows_native.RowReader",
    .tp_basicsize = sizeof(RowReader),
    .tp_dealloc = (destructor)RowReader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = RowReader_doc,
    .tp_call = (ternaryfunc)RowReader_call,
    .tp_init = (initproc)RowReader_init,
    .tp_new = PyType_GenericNew,
};

/* --- JSON numbers: JsonNumber written by orjson without a Python frame ------------- */

PyDoc_STRVAR(install_values_doc,
             "install_values(number_type, unchanged_toast)\n\n"
             "number_type: pgvalues.JsonNumber (one slot, `text`); unchanged_toast: "
             "logical.messages.UNCHANGED_TOAST. Called once by pgvalues, before any reader.");

static PyObject *
install_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "install_values(number_type, unchanged_toast)");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    /* the slot's member descriptor gives its offset: a class of one object slot only */
    PyObject *descr = PyDict_GetItemString(type->tp_dict, "text");
    if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type ||
        ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX ||
        type->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) + sizeof(PyObject *))) {
        PyErr_SetString(PyExc_TypeError, "number_type must have one slot, named text");
        return NULL;
    }
    Py_XSETREF(number_type, (PyTypeObject *)Py_NewRef(args[0]));
    number_text_offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_XSETREF(unchanged_toast, Py_NewRef(args[1]));
    PyObject *text = PyBytes_FromString("-0.0");
    if (text == NULL)
        return NULL;
    Py_XSETREF(minus_zero, new_number(text));
    Py_DECREF(text);
    if (minus_zero == NULL)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(install_default_doc,
             "install_default(fragment_type, fallback)\n\n"
             "fragment_type: orjson.Fragment; fallback: jsonenc's Python default, which "
             "json_default calls for every type but JsonNumber. Called once by jsonenc.");

static PyObject *
install_default(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "install_default(fragment_type, fallback)");
        return NULL;
    }
    Py_XSETREF(fragment_type, Py_NewRef(args[0]));
    Py_XSETREF(fallback_default, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(json_number_doc, "json_number(text) -> JsonNumber(text), without a Python frame.");

static PyObject *
json_number(PyObject *self, PyObject *text)
{
    if (number_type == NULL || !PyBytes_CheckExact(text)) {
        PyErr_SetString(PyExc_TypeError, "json_number(bytes) after install_values()");
        return NULL;
    }
    return new_number(text);
}

PyDoc_STRVAR(json_default_doc,
             "json_default(obj): orjson's default: a JsonNumber's text as an orjson.Fragment, "
             "anything else through jsonenc's Python default.");

static PyObject *
json_default(PyObject *self, PyObject *obj)
{
    if (number_type == NULL || fallback_default == NULL) {
        PyErr_SetString(PyExc_TypeError, "json_default before install_values/default()");
        return NULL;
    }
    if (Py_TYPE(obj) == number_type) {
        PyObject *text = *(PyObject **)((char *)obj + number_text_offset);
        if (text != NULL)
            return PyObject_CallOneArg(fragment_type, text);
    }
    return PyObject_CallOneArg(fallback_default, obj);
}

static PyMethodDef module_methods[] = {
    {"install_values", (PyCFunction)(void (*)(void))install_values, METH_FASTCALL,
     install_values_doc},
    {"install_default", (PyCFunction)(void (*)(void))install_default, METH_FASTCALL,
     install_default_doc},
    {"json_number", json_number, METH_O, json_number_doc},
    {"json_default", json_default, METH_O, json_default_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pg2sink.changelog._rows_native",
    "pgoutput new rows -> {column: value} in C (see logical/fastpath.py's Python reader).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__rows_native(void)
{
    return module_with_type(&module, &RowReaderType, "RowReader");
}
