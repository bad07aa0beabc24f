/*
 * What pg2sink's two C extensions share (_avro_native.c, the Kafka sink's Avro
 * encoder, and _rows_native.c, the changelog's new-row reader): the digit and
 * big-endian readers of pgoutput's text and framing, and the module set-up of an
 * extension that exports one type. Included by both after <Python.h> and <datetime.h>;
 * everything is static so each extension keeps its own copy.
 */
#ifndef PG2SINK_NATIVE_H
#define PG2SINK_NATIVE_H

#include <stdint.h>

static inline int
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* n digits at s as a number; -1 if any is not a digit. */
static inline int
digits(const char *s, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!is_digit(s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* pgoutput's lengths and counts are big-endian */
static inline uint32_t
be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The module of `def` with `type` under `name`, datetime's C API imported (both
 * extensions build datetime values or read them), or NULL with the error set. */
static PyObject *
module_with_type(PyModuleDef *def, PyTypeObject *type, const char *name)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    if (PyType_Ready(type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, name, (PyObject *)type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

#endif
