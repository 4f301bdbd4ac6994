/* client.cdc._pgnative: one pgoutput change message to its Debezium records, in C (an
optional extension, built as storage._native is: setup.py, `make native`).

The reference is the pure-Python path it short-cuts, byte for byte:

  encode_change(payload, specs, source_head, records) -> bool
      what ChangeAssembler.feed(pgoutput.decode(payload)) appends to `records` for an
      Insert, an Update without an old image, or a Delete ('K' or 'O'): the ChangeRecords
      whose key and value are json.dumps of the event (default separators,
      ensure_ascii=False), a delete's tombstone after it.

Decision: the C path handles the common shapes and declines everything else. It returns
False, having appended nothing and with no exception set, for any other message type, an
unknown relation (no spec), an Update with an old image ('K': the key may have changed,
'O': REPLICA IDENTITY FULL, whose TOAST merging is Python's), a column count other than the
Relation's, a malformed payload (short, trailing bytes, unknown kind or marker), text that
is not UTF-8, a converter that raises or returns something other than a JSON scalar, a
non-finite float: the caller then runs the Python path, which gives the result or raises
the error it always did. So the C path never has its own error messages to keep equal.

A spec (ChangeAssembler._native_spec, one per Relation) is a tuple:
  (topic: str, source_tail: bytes, heads: tuple[bytes, ...], kinds: bytes,
   converters: tuple[callable, ...], key: tuple[int, ...], record_type: type)
heads[i] is json.dumps(column name) + ": "; kinds[i] is 'i' (an integer type: its text is
the JSON when canonical), 's' (text: the JSON string of its UTF-8), 'o' (converters[i]
makes the scalar, serialized as json does); key holds the primary key's column indexes in
the key's order (every key column is a column of the relation, or there is no spec).

Records are made as ChangeRecord's generated __init__ would (a frozen slots dataclass:
object.__setattr__ of topic, key, value), with PyObject_GenericSetAttr on a fresh object.

Safety: every read checks the position against the payload's length first; lengths are
int32 from the payload, checked non-negative and within the remaining bytes before use,
and sizes are Py_ssize_t (64 bits), so nothing overflows. The GIL is held throughout.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* --- a growable byte buffer ----------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int
buf_put(Buf *b, const void *src, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) {
            cap *= 2;
        }
        char *grown = PyMem_Realloc(b->data, (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

#define PUT_LITERAL(b, s) buf_put((b), (s), (Py_ssize_t)(sizeof(s) - 1))

static int
put_bytes_object(Buf *b, PyObject *bytes)
{
    return buf_put(b, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

/* A JSON string of UTF-8 text, as json's encoder with ensure_ascii=False writes it:
   '"' and '\\' escaped, \b \f \n \r \t short, other controls \u00xx (lowercase). */
static int
put_json_string(Buf *b, const unsigned char *s, Py_ssize_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (PUT_LITERAL(b, "\"") < 0) {
        return -1;
    }
    Py_ssize_t run = 0; /* bytes copied as they are, pending */
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        if (run && buf_put(b, s + i - run, run) < 0) {
            return -1;
        }
        run = 0;
        char escape[6] = {'\\', 0, 0, 0, 0, 0};
        Py_ssize_t size = 2;
        switch (c) {
        case '"': escape[1] = '"'; break;
        case '\\': escape[1] = '\\'; break;
        case '\b': escape[1] = 'b'; break;
        case '\f': escape[1] = 'f'; break;
        case '\n': escape[1] = 'n'; break;
        case '\r': escape[1] = 'r'; break;
        case '\t': escape[1] = 't'; break;
        default:
            escape[1] = 'u';
            escape[2] = '0';
            escape[3] = '0';
            escape[4] = hex[c >> 4];
            escape[5] = hex[c & 0xF];
            size = 6;
        }
        if (buf_put(b, escape, size) < 0) {
            return -1;
        }
    }
    if (run && buf_put(b, s + n - run, run) < 0) {
        return -1;
    }
    return PUT_LITERAL(b, "\"");
}

/* 1 when the bytes are valid UTF-8 as Python's strict decoder sees it, 0 when not
   (nothing raised), -1 on another error. ASCII, nearly all of it, needs no decoder. */
static int
valid_utf8(const unsigned char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] >= 0x80) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)s, n, "strict");
            if (text == NULL) {
                if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    PyErr_Clear();
                    return 0;
                }
                return -1;
            }
            Py_DECREF(text);
            return 1;
        }
    }
    return 1;
}

/* The decimal spelling int() parses and json writes back unchanged: -?(0|[1-9][0-9]*),
   not "-0". */
static int
canonical_integer(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    if (n > 0 && s[0] == '-') {
        i = 1;
    }
    if (i >= n) {
        return 0;
    }
    if (s[i] == '0') {
        return n == i + 1 && i == 0;
    }
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
    }
    return 1;
}

/* A converter's result as json writes it. 1 written, 0 not a JSON scalar json would
   write the same way (decline), -1 error. */
static int
put_scalar(Buf *b, PyObject *value)
{
    if (value == Py_None) {
        return PUT_LITERAL(b, "null") < 0 ? -1 : 1;
    }
    if (value == Py_True) {
        return PUT_LITERAL(b, "true") < 0 ? -1 : 1;
    }
    if (value == Py_False) {
        return PUT_LITERAL(b, "false") < 0 ? -1 : 1;
    }
    if (PyUnicode_CheckExact(value)) {
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(value, &size);
        if (utf8 == NULL) {
            PyErr_Clear(); /* a lone surrogate: Python's path raises it */
            return 0;
        }
        return put_json_string(b, (const unsigned char *)utf8, size) < 0 ? -1 : 1;
    }
    PyObject *text = NULL;
    if (PyLong_CheckExact(value)) {
        text = PyLong_Type.tp_repr(value);
    }
    else if (PyFloat_CheckExact(value)) {
        if (!isfinite(PyFloat_AS_DOUBLE(value))) {
            return 0;
        }
        text = PyFloat_Type.tp_repr(value); /* json's float.__repr__ */
    }
    else {
        return 0;
    }
    if (text == NULL) {
        return -1;
    }
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &size);
    int done = utf8 == NULL ? -1 : buf_put(b, utf8, size) < 0 ? -1 : 1;
    Py_DECREF(text);
    return done;
}

/* --- one tuple as a row object -------------------------------------------------------- */

typedef struct {
    const unsigned char *data;
    Py_ssize_t size;
    Py_ssize_t pos;
} Cursor;

typedef struct {
    PyObject *heads;      /* tuple of bytes */
    const char *kinds;    /* one byte a column */
    PyObject *converters; /* tuple of callables */
    PyObject *key;        /* tuple of int */
    Py_ssize_t ncols;
} Spec;

static const char UNAVAILABLE[] = "\"__debezium_unavailable_value\"";

/* Reads one TupleData at c->pos into `row` as a JSON object of the columns (only the key
   columns when `key_only`), noting each written column's value as [start, end) in
   `spans` (2 a column; -1 for a column not written). 1 done, 0 decline, -1 error. */
static int
put_row(Buf *row, Cursor *c, const Spec *spec, const char *in_key, int key_only,
        Py_ssize_t *spans)
{
    if (c->pos + 2 > c->size) {
        return 0;
    }
    const Py_ssize_t count = (Py_ssize_t)(int16_t)((c->data[c->pos] << 8) | c->data[c->pos + 1]);
    c->pos += 2;
    if (count != spec->ncols) {
        return 0;
    }
    if (PUT_LITERAL(row, "{") < 0) {
        return -1;
    }
    int first = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        spans[2 * i] = spans[2 * i + 1] = -1;
        if (c->pos >= c->size) {
            return 0;
        }
        const unsigned char kind = c->data[c->pos++];
        const unsigned char *text = NULL;
        Py_ssize_t length = 0;
        if (kind == 't' || kind == 'b') {
            if (c->pos + 4 > c->size) {
                return 0;
            }
            const unsigned char *p = c->data + c->pos;
            length = (Py_ssize_t)(int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
                                           ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
            c->pos += 4;
            if (length < 0 || length > c->size - c->pos) {
                return 0;
            }
            text = c->data + c->pos;
            c->pos += length;
        }
        else if (kind != 'n' && kind != 'u') {
            return 0;
        }
        if (key_only && !in_key[i]) {
            continue;
        }
        if (!first && PUT_LITERAL(row, ", ") < 0) {
            return -1;
        }
        first = 0;
        if (put_bytes_object(row, PyTuple_GET_ITEM(spec->heads, i)) < 0) {
            return -1;
        }
        spans[2 * i] = row->len;
        int done = 1;
        if (kind == 'n') {
            done = PUT_LITERAL(row, "null") < 0 ? -1 : 1;
        }
        else if (kind == 'u') {
            done = PUT_LITERAL(row, UNAVAILABLE) < 0 ? -1 : 1;
        }
        else if (kind == 'b') { /* bytes.hex() */
            static const char hex[] = "0123456789abcdef";
            done = PUT_LITERAL(row, "\"") < 0 ? -1 : 1;
            for (Py_ssize_t j = 0; done == 1 && j < length; j++) {
                const char pair[2] = {hex[text[j] >> 4], hex[text[j] & 0xF]};
                done = buf_put(row, pair, 2) < 0 ? -1 : 1;
            }
            if (done == 1) {
                done = PUT_LITERAL(row, "\"") < 0 ? -1 : 1;
            }
        }
        else if (spec->kinds[i] == 'i' && canonical_integer(text, length)) {
            done = buf_put(row, text, length) < 0 ? -1 : 1;
        }
        else if (spec->kinds[i] == 's') {
            done = valid_utf8(text, length);
            if (done == 1) {
                done = put_json_string(row, text, length) < 0 ? -1 : 1;
            }
        }
        else {
            PyObject *raw = PyBytes_FromStringAndSize((const char *)text, length);
            if (raw == NULL) {
                return -1;
            }
            PyObject *value = PyObject_CallOneArg(PyTuple_GET_ITEM(spec->converters, i), raw);
            Py_DECREF(raw);
            if (value == NULL) {
                PyErr_Clear(); /* Python's path raises it */
                return 0;
            }
            done = put_scalar(row, value);
            Py_DECREF(value);
        }
        if (done != 1) {
            return done;
        }
        spans[2 * i + 1] = row->len;
    }
    return PUT_LITERAL(row, "}") < 0 ? -1 : 1;
}

/* The key object from the row's spans, in the key's order. 1 done, 0 decline, -1 error. */
static int
put_key(Buf *key, const Buf *row, const Spec *spec, const Py_ssize_t *spans)
{
    const Py_ssize_t n = PyTuple_GET_SIZE(spec->key);
    if (PUT_LITERAL(key, "{") < 0) {
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec->key, k));
        if (i < 0 || i >= spec->ncols || spans[2 * i] < 0) {
            PyErr_Clear();
            return 0;
        }
        if ((k && PUT_LITERAL(key, ", ") < 0) ||
            put_bytes_object(key, PyTuple_GET_ITEM(spec->heads, i)) < 0 ||
            buf_put(key, row->data + spans[2 * i], spans[2 * i + 1] - spans[2 * i]) < 0) {
            return -1;
        }
    }
    return PUT_LITERAL(key, "}") < 0 ? -1 : 1;
}

/* --- records ------------------------------------------------------------------------- */

static PyObject *str_topic, *str_key, *str_value;

static PyObject *
make_record(PyTypeObject *type, PyObject *topic, PyObject *key, PyObject *value)
{
    PyObject *record = type->tp_alloc(type, 0);
    if (record == NULL) {
        return NULL;
    }
    if (PyObject_GenericSetAttr(record, str_topic, topic) < 0 ||
        PyObject_GenericSetAttr(record, str_key, key) < 0 ||
        PyObject_GenericSetAttr(record, str_value, value) < 0) {
        Py_DECREF(record);
        return NULL;
    }
    return record;
}

PyDoc_STRVAR(encode_change_doc,
             "encode_change(payload, specs, source_head, records) -> bool\n\n"
             "Append the ChangeRecords of one pgoutput Insert, Update (no old image) or "
             "Delete to records; False (nothing appended) for anything else.");

static PyObject *
encode_change(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyDict_Check(args[1]) ||
        !PyBytes_Check(args[2]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_change(payload, specs: dict, source_head: bytes, "
                        "records: list)");
        return NULL;
    }
    if (!PyBytes_Check(args[0])) {
        Py_RETURN_FALSE; /* a memoryview or bytearray: the Python path copies it */
    }
    Cursor c = {(const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), 0};
    if (c.size < 6) {
        Py_RETURN_FALSE;
    }
    const unsigned char type = c.data[0];
    const unsigned char marker = c.data[5];
    const char *op;
    int key_only = 0;
    if (type == 'I' && marker == 'N') {
        op = "{\"op\": \"c\", \"before\": ";
    }
    else if (type == 'U' && marker == 'N') {
        op = "{\"op\": \"u\", \"before\": ";
    }
    else if (type == 'D' && (marker == 'K' || marker == 'O')) {
        op = "{\"op\": \"d\", \"before\": ";
        key_only = marker == 'K';
    }
    else {
        Py_RETURN_FALSE;
    }
    const uint32_t oid = ((uint32_t)c.data[1] << 24) | ((uint32_t)c.data[2] << 16) |
                         ((uint32_t)c.data[3] << 8) | (uint32_t)c.data[4];
    c.pos = 6;
    PyObject *oid_object = PyLong_FromUnsignedLong(oid);
    if (oid_object == NULL) {
        return NULL;
    }
    PyObject *spec_tuple = PyDict_GetItemWithError(args[1], oid_object); /* borrowed */
    Py_DECREF(oid_object);
    if (spec_tuple == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    if (!PyTuple_Check(spec_tuple) || PyTuple_GET_SIZE(spec_tuple) != 7) {
        PyErr_SetString(PyExc_TypeError, "encode_change: a spec is a 7-tuple");
        return NULL;
    }
    PyObject *topic = PyTuple_GET_ITEM(spec_tuple, 0);
    PyObject *tail = PyTuple_GET_ITEM(spec_tuple, 1);
    PyObject *kinds = PyTuple_GET_ITEM(spec_tuple, 3);
    PyObject *record_type = PyTuple_GET_ITEM(spec_tuple, 6);
    Spec spec = {PyTuple_GET_ITEM(spec_tuple, 2), NULL, PyTuple_GET_ITEM(spec_tuple, 4),
                 PyTuple_GET_ITEM(spec_tuple, 5), 0};
    if (!PyBytes_Check(tail) || !PyTuple_Check(spec.heads) || !PyBytes_Check(kinds) ||
        !PyTuple_Check(spec.converters) || !PyTuple_Check(spec.key) ||
        !PyType_Check(record_type) || PyBytes_GET_SIZE(kinds) != PyTuple_GET_SIZE(spec.heads) ||
        PyTuple_GET_SIZE(spec.converters) != PyTuple_GET_SIZE(spec.heads)) {
        PyErr_SetString(PyExc_TypeError, "encode_change: a malformed spec");
        return NULL;
    }
    spec.kinds = PyBytes_AS_STRING(kinds);
    spec.ncols = PyTuple_GET_SIZE(spec.heads);
    for (Py_ssize_t i = 0; i < spec.ncols; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(spec.heads, i))) {
            PyErr_SetString(PyExc_TypeError, "encode_change: a spec's heads are bytes");
            return NULL;
        }
    }

    PyObject *result = NULL;
    Buf row = {0}, key = {0}, value = {0};
    Py_ssize_t *spans = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(spec.ncols + 1));
    char *in_key = PyMem_Calloc((size_t)spec.ncols + 1, 1);
    PyObject *key_bytes = NULL, *value_bytes = NULL, *record = NULL, *tombstone = NULL;
    if (spans == NULL || in_key == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(spec.key); k++) {
        const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec.key, k));
        if (i < 0 || i >= spec.ncols) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "encode_change: a key index out of range");
            }
            goto done;
        }
        in_key[i] = 1;
    }
    int status = put_row(&row, &c, &spec, in_key, key_only, spans);
    if (status == 1 && c.pos != c.size) {
        status = 0; /* trailing bytes: Python's decoder refuses them */
    }
    if (status == 1) {
        status = put_key(&key, &row, &spec, spans);
    }
    if (status < 0) {
        goto done;
    }
    if (status == 0) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    const int deleted = type == 'D';
    if (buf_put(&value, op, (Py_ssize_t)strlen(op)) < 0 ||
        (deleted ? buf_put(&value, row.data, row.len) : PUT_LITERAL(&value, "null")) < 0 ||
        PUT_LITERAL(&value, ", \"after\": ") < 0 ||
        (deleted ? PUT_LITERAL(&value, "null") : buf_put(&value, row.data, row.len)) < 0 ||
        PUT_LITERAL(&value, ", \"source\": ") < 0 || put_bytes_object(&value, args[2]) < 0 ||
        put_bytes_object(&value, tail) < 0 || PUT_LITERAL(&value, "}") < 0) {
        goto done;
    }
    key_bytes = PyBytes_FromStringAndSize(key.data, key.len);
    value_bytes = key_bytes ? PyBytes_FromStringAndSize(value.data, value.len) : NULL;
    if (value_bytes == NULL) {
        goto done;
    }
    record = make_record((PyTypeObject *)record_type, topic, key_bytes, value_bytes);
    if (record == NULL) {
        goto done;
    }
    if (deleted) {
        tombstone = make_record((PyTypeObject *)record_type, topic, key_bytes, Py_None);
        if (tombstone == NULL) {
            goto done;
        }
    }
    if (PyList_Append(args[3], record) < 0) {
        goto done;
    }
    if (tombstone != NULL && PyList_Append(args[3], tombstone) < 0) {
        /* Undo the first append: all or nothing. */
        PyList_SetSlice(args[3], PyList_GET_SIZE(args[3]) - 1, PyList_GET_SIZE(args[3]), NULL);
        goto done;
    }
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(key_bytes);
    Py_XDECREF(value_bytes);
    Py_XDECREF(record);
    Py_XDECREF(tombstone);
    PyMem_Free(row.data);
    PyMem_Free(key.data);
    PyMem_Free(value.data);
    PyMem_Free(spans);
    PyMem_Free(in_key);
    return result;
}

static PyMethodDef pgnative_methods[] = {
    {"encode_change", (PyCFunction)(void (*)(void))encode_change, METH_FASTCALL,
     encode_change_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef pgnative_module = {
    PyModuleDef_HEAD_INIT,
    "tidelog.client.cdc._pgnative",
    "pgoutput changes to Debezium records in C; client.cdc.events is the reference.",
    -1,
    pgnative_methods,
};

PyMODINIT_FUNC
PyInit__pgnative(void)
{
    str_topic = PyUnicode_InternFromString("topic");
    str_key = PyUnicode_InternFromString("key");
    str_value = PyUnicode_InternFromString("value");
    if (str_topic == NULL || str_key == NULL || str_value == NULL) {
        return NULL;
    }
    return PyModule_Create(&pgnative_module);
}
