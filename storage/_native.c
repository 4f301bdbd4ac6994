/* storage._native: the record codec's hot loops in C (an optional extension).

The reference is the pure-Python code this mirrors, byte for byte and error for error:

  decode_records       storage.records._decode_records: RecordBatch v2 records (already
                       decompressed) into Record / ConsumerRecord tuples
  ColumnBuilder        the same records into Arrow-layout column buffers (offsets and
                       timestamps as int64, keys and values as validity + int32 offsets +
                       data, headers as list<struct<string, binary>>): no Python object
                       per record; storage.columns.PyColumnBuilder is its pure twin
  encode_records_into  the loop of storage.batch_builder.BatchBuilder.extend
  murmur2, murmur2_partitions  client.partitioner.murmur2, for one key or many

Safety: every read goes through the `Reader` helpers below, which check the position
against the end of the buffer before touching a byte; every length is checked against the
record's end before it is used as a slice, and all size arithmetic is done in 64 bits
(Py_ssize_t) on values that came from at most 32-bit varints, so it cannot overflow. A
record's key, value and headers become objects only after the whole record parsed and its
fields ended exactly at its declared end, so every slice lies inside [start, end) of the
buffer. Malformed bytes raise storage.errors.CorruptRecordError with the messages of the
pure-Python decoder; the differential tests (tests/storage/test_native.py) hold the two
to the same results and the same error class on generated, cut and bit-flipped batches.

The GIL is held throughout: the buffers are borrowed from Python objects, and building
the result objects needs it anyway. Thread-safety is Python's: decode_records and the
murmur functions are pure; a ColumnBuilder belongs to one thread.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *CorruptRecordError = NULL; /* storage.errors.CorruptRecordError */

/* --- reading records --------------------------------------------------------------- */

typedef struct {
    const unsigned char *data; /* the records data: positions are relative to it */
    Py_ssize_t end;
    Py_ssize_t batch_position;  /* for messages: where the batch starts in its buffer */
    Py_ssize_t record_start;    /* for messages: the record being read */
} Reader;

/* Raise CorruptRecordError("batch at position B: record at byte R of the records data:
   <what>"), as storage.records._record_error. Returns -1 for `return record_error(...)`. */
static int
record_error(const Reader *r, const char *format, ...)
{
    char what[200];
    va_list args;
    va_start(args, format);
    PyOS_vsnprintf(what, sizeof(what), format, args);
    va_end(args);
    PyErr_Format(CorruptRecordError,
                 "batch at position %zd: record at byte %zd of the records data: %s",
                 r->batch_position, r->record_start, what);
    return -1;
}

/* storage.varint's strict decoder, as reached through records._slow_varint: at most
   `bits` / 7 rounded up bytes, value within `bits` bits, never past the end. */
static int
read_unsigned_slow(const Reader *r, Py_ssize_t *pos, int bits, const char *kind,
                   uint64_t *out)
{
    const int max_bytes = (bits + 6) / 7;
    const Py_ssize_t start = *pos;
    Py_ssize_t p = start;
    uint64_t result = 0;
    int overflow = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= r->end) {
            PyErr_Format(CorruptRecordError,
                         "batch at position %zd: records data: %s at position %zd runs past "
                         "the end of the data",
                         r->batch_position, kind, start);
            return -1;
        }
        const unsigned int b = r->data[p++];
        const int shift = 7 * i;
        result |= (uint64_t)(b & 0x7F) << shift;
        if (shift + 7 > bits && ((b & 0x7F) >> (bits - shift)) != 0) {
            overflow = 1; /* bits the value cannot hold; reported once the varint ends */
        }
        if (b < 0x80) {
            if (overflow) {
                PyErr_Format(CorruptRecordError,
                             "batch at position %zd: records data: %s at position %zd "
                             "overflows %d bits",
                             r->batch_position, kind, start, bits);
                return -1;
            }
            *pos = p;
            *out = result;
            return 0;
        }
    }
    PyErr_Format(CorruptRecordError,
                 "batch at position %zd: records data: %s at position %zd is longer than %d "
                 "bytes",
                 r->batch_position, kind, start, max_bytes);
    return -1;
}

static int
read_varint_slow(const Reader *r, Py_ssize_t *pos, int32_t *out)
{
    uint64_t zz;
    if (read_unsigned_slow(r, pos, 32, "varint", &zz) < 0) {
        return -1;
    }
    const uint32_t z = (uint32_t)zz;
    *out = (int32_t)((z >> 1) ^ (0u - (z & 1)));
    return 0;
}

static int
read_varlong_slow(const Reader *r, Py_ssize_t *pos, int64_t *out)
{
    uint64_t zz;
    if (read_unsigned_slow(r, pos, 64, "varlong", &zz) < 0) {
        return -1;
    }
    *out = (int64_t)((zz >> 1) ^ (0u - (zz & 1)));
    return 0;
}

/* The hot loop's reads: 1- and 2-byte varints inline, the strict decoder beyond. A read
   of a missing first or second byte is the pure decoder's IndexError: "runs past the
   end" of the record. */
static inline int
read_varint(const Reader *r, Py_ssize_t *pos, int32_t *out)
{
    Py_ssize_t p = *pos;
    if (p >= r->end) {
        return record_error(r, "runs past the end");
    }
    const unsigned int b = r->data[p];
    if (b < 0x80) {
        *out = (int32_t)((b >> 1) ^ (0u - (b & 1)));
        *pos = p + 1;
        return 0;
    }
    if (p + 1 >= r->end) {
        return record_error(r, "runs past the end");
    }
    const unsigned int c = r->data[p + 1];
    if (c < 0x80) {
        const unsigned int z = (b & 0x7F) | (c << 7);
        *out = (int32_t)((z >> 1) ^ (0u - (z & 1)));
        *pos = p + 2;
        return 0;
    }
    return read_varint_slow(r, pos, out);
}

static inline int
read_varlong(const Reader *r, Py_ssize_t *pos, int64_t *out)
{
    Py_ssize_t p = *pos;
    if (p >= r->end) {
        return record_error(r, "runs past the end");
    }
    const unsigned int b = r->data[p];
    if (b < 0x80) {
        *out = (int64_t)(int32_t)((b >> 1) ^ (0u - (b & 1)));
        *pos = p + 1;
        return 0;
    }
    if (p + 1 >= r->end) {
        return record_error(r, "runs past the end");
    }
    const unsigned int c = r->data[p + 1];
    if (c < 0x80) {
        const unsigned int z = (b & 0x7F) | (c << 7);
        *out = (int64_t)(int32_t)((z >> 1) ^ (0u - (z & 1)));
        *pos = p + 2;
        return 0;
    }
    return read_varlong_slow(r, pos, out);
}

/* Strict UTF-8, as Python's decoder: no overlong forms, no surrogates, nothing past
   U+10FFFF, no truncated sequences. */
static int
utf8_valid(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        const unsigned int c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t need;
        unsigned int low = 0x80, high = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) {
                low = 0xA0;
            }
            else if (c == 0xED) {
                high = 0x9F;
            }
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) {
                low = 0x90;
            }
            else if (c == 0xF4) {
                high = 0x8F;
            }
        }
        else {
            return 0;
        }
        if (n - i <= need) {
            return 0;
        }
        if (s[i + 1] < low || s[i + 1] > high) {
            return 0;
        }
        for (Py_ssize_t k = 2; k <= need; k++) {
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) {
                return 0;
            }
        }
        i += need + 1;
    }
    return 1;
}

/* One parsed record: positions into the reader's data. Lengths of -1 are nulls. */
typedef struct {
    int64_t offset;
    int64_t timestamp;
    Py_ssize_t key_position;
    Py_ssize_t key_length;
    Py_ssize_t value_position;
    Py_ssize_t value_length;
    Py_ssize_t headers_position; /* the first header, after the count */
    int32_t header_count;
    Py_ssize_t header_bytes;     /* bytes of header keys + values */
} ParsedRecord;

typedef struct {
    int64_t base_offset;
    int64_t base_timestamp;
    int has_append_time;
    int64_t append_time;
    int32_t last_offset_delta;
} BatchFields;

/* Headers as _decode_headers: the count and every length through the strict decoder. */
static int
parse_headers(const Reader *r, Py_ssize_t *pos, Py_ssize_t record_end, ParsedRecord *rec)
{
    int32_t count;
    if (read_varint_slow(r, pos, &count) < 0) {
        return -1;
    }
    if (count < 0 || count > record_end - *pos) { /* each header takes at least 2 bytes */
        return record_error(r, "header count %d", (int)count);
    }
    rec->header_count = count;
    rec->headers_position = *pos;
    Py_ssize_t bytes = 0;
    for (int32_t i = 0; i < count; i++) {
        int32_t key_length = 0, value_length = 0;
        if (read_varint_slow(r, pos, &key_length) < 0) {
            return -1;
        }
        if (key_length < 0 || *pos + key_length > record_end) {
            return record_error(r, "header key length %d", (int)key_length);
        }
        if (!utf8_valid(r->data + *pos, key_length)) {
            return record_error(r, "header key not UTF-8");
        }
        *pos += key_length;
        bytes += key_length;
        if (read_varint_slow(r, pos, &value_length) < 0) {
            return -1;
        }
        if (value_length == -1) {
            continue;
        }
        if (value_length < 0 || value_length > record_end - *pos) {
            return record_error(r, "header value length %d", (int)value_length);
        }
        *pos += value_length;
        bytes += value_length;
    }
    rec->header_bytes = bytes;
    return 0;
}

/* Parse the record at *pos; on success every field lies inside [record start, *pos). */
static int
parse_record(Reader *r, Py_ssize_t *pos, const BatchFields *batch, int32_t *previous_delta,
             ParsedRecord *rec)
{
    Py_ssize_t p = *pos;
    r->record_start = p;
    int32_t length = 0, offset_delta = 0, key_length = 0, value_length = 0;
    int64_t timestamp_delta = 0;
    if (read_varint(r, &p, &length) < 0) {
        return -1;
    }
    const Py_ssize_t record_end = p + (Py_ssize_t)length;
    if (record_end > r->end || length < 6) { /* 6 = smallest record: six 1-byte fields */
        return record_error(r, "length %d is below 6 or runs past the end", (int)length);
    }
    p += 1; /* attributes: unused */
    if (read_varlong(r, &p, &timestamp_delta) < 0 || read_varint(r, &p, &offset_delta) < 0) {
        return -1;
    }
    if (offset_delta <= *previous_delta || offset_delta > batch->last_offset_delta) {
        return record_error(r, "offset delta %d out of order", (int)offset_delta);
    }
    *previous_delta = offset_delta;
    if (read_varint(r, &p, &key_length) < 0) {
        return -1;
    }
    if (key_length < -1) {
        return record_error(r, "key length %d", (int)key_length);
    }
    rec->key_position = p;
    rec->key_length = key_length;
    if (key_length > 0) {
        p += key_length; /* may pass the record's end: caught by the checks below */
    }
    if (read_varint(r, &p, &value_length) < 0) {
        return -1;
    }
    if (value_length < -1) {
        return record_error(r, "value length %d", (int)value_length);
    }
    rec->value_position = p;
    rec->value_length = value_length;
    if (value_length > 0) {
        p += value_length;
    }
    if (p >= r->end) {
        return record_error(r, "runs past the end");
    }
    rec->header_count = 0;
    rec->header_bytes = 0;
    rec->headers_position = p + 1;
    if (r->data[p] == 0) {
        p += 1;
    }
    else if (parse_headers(r, &p, record_end, rec) < 0) {
        return -1;
    }
    if (p != record_end) {
        return record_error(r, "fields end at %zd, length says %zd", p, record_end);
    }
    /* offset_delta is in [0, last_offset_delta] and the caller checked that the last
       offset fits int64; timestamps wrap as Java's long arithmetic. */
    rec->offset = batch->base_offset + offset_delta;
    rec->timestamp = batch->has_append_time
                         ? batch->append_time
                         : (int64_t)((uint64_t)batch->base_timestamp + (uint64_t)timestamp_delta);
    *pos = p;
    return 0;
}

static int
check_trailing(const Reader *r, Py_ssize_t pos, Py_ssize_t count)
{
    if (pos != r->end) {
        PyErr_Format(CorruptRecordError,
                     "batch at position %zd: %zd bytes left after %zd records (recordsCount too "
                     "small or trailing garbage)",
                     r->batch_position, r->end - pos, count);
        return -1;
    }
    return 0;
}

/* --- decode_records: records into row tuples ----------------------------------------- */

static PyObject *
bytes_or_none(const unsigned char *data, Py_ssize_t position, Py_ssize_t length)
{
    if (length < 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)data + position, length);
}

/* The headers of a parsed (hence valid) record as a tuple of (str, bytes | None). */
static PyObject *
build_headers(const unsigned char *data, const ParsedRecord *rec)
{
    if (rec->header_count == 0) {
        return PyTuple_New(0);
    }
    PyObject *headers = PyTuple_New(rec->header_count);
    if (headers == NULL) {
        return NULL;
    }
    Reader r = {data, PY_SSIZE_T_MAX, 0, 0};
    Py_ssize_t p = rec->headers_position;
    for (int32_t i = 0; i < rec->header_count; i++) {
        int32_t key_length = 0, value_length = 0;
        (void)read_varint_slow(&r, &p, &key_length); /* validated by parse_headers */
        PyObject *key = PyUnicode_DecodeUTF8((const char *)data + p, key_length, "strict");
        p += key_length;
        (void)read_varint_slow(&r, &p, &value_length);
        PyObject *value = bytes_or_none(data, p, value_length);
        if (value_length > 0) {
            p += value_length;
        }
        PyObject *pair = (key && value) ? PyTuple_Pack(2, key, value) : NULL;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (pair == NULL) {
            Py_DECREF(headers);
            return NULL;
        }
        PyObject_GC_UnTrack(pair); /* (str, bytes | None): no cycle can pass through it */
        PyTuple_SET_ITEM(headers, i, pair);
    }
    PyObject_GC_UnTrack(headers); /* pairs of atomic objects only */
    return headers;
}

/* True when obj can hold no reference back to a container: None, an exact int, bytes or
   str. A row of such fields (and of headers built above) cannot be part of a cycle. */
static int
is_atomic(PyObject *obj)
{
    return obj == Py_None || PyLong_CheckExact(obj) || PyBytes_CheckExact(obj) ||
           PyUnicode_CheckExact(obj);
}

static PyObject *
new_row(PyTypeObject *row_type, Py_ssize_t size)
{
    if (row_type == &PyTuple_Type) {
        return PyTuple_New(size);
    }
    /* As tuple.__new__(row_type, ...): a tuple subclass instance, its items set below. */
    return row_type->tp_alloc(row_type, size);
}

static int
parse_batch_fields(PyObject *base_offset, PyObject *base_timestamp, PyObject *append_time,
                   PyObject *last_offset_delta, BatchFields *batch)
{
    batch->base_offset = PyLong_AsLongLong(base_offset);
    batch->base_timestamp = PyLong_AsLongLong(base_timestamp);
    batch->has_append_time = append_time != Py_None;
    batch->append_time = batch->has_append_time ? PyLong_AsLongLong(append_time) : 0;
    const long delta = PyLong_AsLong(last_offset_delta);
    if (PyErr_Occurred()) {
        return -1;
    }
    if (delta < INT32_MIN || delta > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "last_offset_delta is not an int32");
        return -1;
    }
    batch->last_offset_delta = (int32_t)delta;
    return 0;
}

static int
get_records_buffer(PyObject *buf, Py_ssize_t start, Py_ssize_t end, Py_buffer *view,
                   Reader *r, Py_ssize_t batch_position)
{
    if (PyObject_GetBuffer(buf, view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    if (start < 0 || end < start || end > view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "records data range outside the buffer");
        return -1;
    }
    r->data = (const unsigned char *)view->buf + start;
    r->end = end - start;
    r->batch_position = batch_position;
    r->record_start = 0;
    return 0;
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(buf, start, end, count, base_offset, base_timestamp, append_time,\n"
"               last_offset_delta, batch_position, row_type, prefix[, times]) -> list\n\n"
"The records of buf[start:end] as row_type tuples: storage.records._decode_records.\n"
"times, with a prefix: (sent_ms, received_ms), each row then ends with these two.");

static PyObject *
decode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 11 && nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "decode_records takes 11 or 12 arguments");
        return NULL;
    }
    const Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    const Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    const Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    const Py_ssize_t batch_position = PyLong_AsSsize_t(args[8]);
    BatchFields batch;
    if (PyErr_Occurred() || parse_batch_fields(args[4], args[5], args[6], args[7], &batch) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[9]) || !PyType_IsSubtype((PyTypeObject *)args[9], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "row_type must be a tuple subclass");
        return NULL;
    }
    PyTypeObject *row_type = (PyTypeObject *)args[9];
    PyObject *prefix = args[10];
    PyObject *first = NULL, *second = NULL;
    if (prefix != Py_None) {
        if (!PyTuple_Check(prefix) || PyTuple_GET_SIZE(prefix) != 2) {
            PyErr_SetString(PyExc_ValueError, "prefix must be a tuple of two fields");
            return NULL;
        }
        first = PyTuple_GET_ITEM(prefix, 0);
        second = PyTuple_GET_ITEM(prefix, 1);
    }
    /* The batch's (sent, received) times: the same two objects end every row. */
    PyObject *sent = NULL, *received = NULL;
    if (nargs == 12 && args[11] != Py_None) {
        if (first == NULL || !PyTuple_Check(args[11]) || PyTuple_GET_SIZE(args[11]) != 2) {
            PyErr_SetString(PyExc_ValueError, "times must be a tuple of two fields, with a prefix");
            return NULL;
        }
        sent = PyTuple_GET_ITEM(args[11], 0);
        received = PyTuple_GET_ITEM(args[11], 1);
    }
    const Py_ssize_t width = prefix == Py_None ? 5 : (sent != NULL ? 9 : 7);
    /* Rows are untracked by the garbage collector when every field is atomic, as the
       collector itself untracks such exact tuples on their first pass (but never a tuple
       subclass's instances: a NamedTuple row stayed tracked for good). A fetch of a
       thousand records otherwise fed the young generation a thousand objects to traverse
       and promote, and the full collections that followed were ~30% of the consumer's
       time (py-spy, 1 KiB records). */
    const int untrack = (first == NULL || (is_atomic(first) && is_atomic(second))) &&
                        (sent == NULL || (is_atomic(sent) && is_atomic(received)));
    Py_buffer view;
    Reader r;
    if (get_records_buffer(args[0], start, end, &view, &r, batch_position) < 0) {
        return NULL;
    }
    /* A hostile count costs nothing up front: the list grows with the records found. */
    PyObject *records = PyList_New(0);
    if (records == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t pos = 0;
    int32_t previous_delta = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        ParsedRecord rec;
        if (parse_record(&r, &pos, &batch, &previous_delta, &rec) < 0) {
            goto error;
        }
        PyObject *offset = PyLong_FromLongLong(rec.offset);
        PyObject *timestamp = PyLong_FromLongLong(rec.timestamp);
        PyObject *key = bytes_or_none(r.data, rec.key_position, rec.key_length);
        PyObject *value = bytes_or_none(r.data, rec.value_position, rec.value_length);
        PyObject *headers = build_headers(r.data, &rec);
        PyObject *row = NULL;
        if (offset && timestamp && key && value && headers) {
            row = new_row(row_type, width);
        }
        if (row == NULL) {
            Py_XDECREF(offset);
            Py_XDECREF(timestamp);
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_XDECREF(headers);
            goto error;
        }
        Py_ssize_t at = 0;
        if (first != NULL) {
            PyTuple_SET_ITEM(row, 0, Py_NewRef(first));
            PyTuple_SET_ITEM(row, 1, Py_NewRef(second));
            at = 2;
        }
        PyTuple_SET_ITEM(row, at, offset);
        PyTuple_SET_ITEM(row, at + 1, timestamp);
        PyTuple_SET_ITEM(row, at + 2, key);
        PyTuple_SET_ITEM(row, at + 3, value);
        PyTuple_SET_ITEM(row, at + 4, headers);
        if (sent != NULL) {
            PyTuple_SET_ITEM(row, 7, Py_NewRef(sent));
            PyTuple_SET_ITEM(row, 8, Py_NewRef(received));
        }
        if (untrack) {
            PyObject_GC_UnTrack(row);
        }
        const int failed = PyList_Append(records, row);
        Py_DECREF(row);
        if (failed) {
            goto error;
        }
    }
    if (check_trailing(&r, pos, count) < 0) {
        goto error;
    }
    PyBuffer_Release(&view);
    return records;
error:
    PyBuffer_Release(&view);
    Py_DECREF(records);
    return NULL;
}

/* --- ColumnBuilder: records into Arrow-layout buffers -------------------------------- */

/* A growable buffer kept in a bytearray, so that finish() hands the memory to Python (and
   on to Arrow) without a copy: copying the columns out cost more than decoding them
   (fresh pages to fault in). `data` caches the bytearray's contents pointer; the
   bytearray's size is the capacity, `length` what is used. */
typedef struct {
    PyObject *array;
    char *data;
    Py_ssize_t length;
    Py_ssize_t capacity;
} Growable;

static int
grow(Growable *g, Py_ssize_t extra)
{
    if (extra > PY_SSIZE_T_MAX / 4 - g->length) {
        PyErr_NoMemory();
        return -1;
    }
    const Py_ssize_t needed = g->length + extra;
    if (needed <= g->capacity) {
        return 0;
    }
    Py_ssize_t capacity = g->capacity ? g->capacity : 256;
    while (capacity < needed) {
        capacity *= 2;
    }
    if (g->array == NULL) {
        g->array = PyByteArray_FromStringAndSize(NULL, capacity);
        if (g->array == NULL) {
            return -1;
        }
    }
    else if (PyByteArray_Resize(g->array, capacity) < 0) { /* the old contents stay */
        return -1;
    }
    g->data = PyByteArray_AS_STRING(g->array);
    g->capacity = capacity;
    return 0;
}

static inline void
put(Growable *g, const void *bytes, Py_ssize_t n) /* after grow(g, >= n) */
{
    if (n > 0) {
        memcpy(g->data + g->length, bytes, (size_t)n);
        g->length += n;
    }
}

/* A nullable binary (or string) column: validity bits, int32 offsets, data. */
typedef struct {
    Growable validity;
    Growable offsets;
    Growable data;
    Py_ssize_t count;
} BinaryColumn;

static int
binary_column_append(BinaryColumn *c, const unsigned char *bytes, Py_ssize_t length)
{
    /* Arrow's binary type has int32 offsets: the column's data must stay below 2 GiB. */
    if (length > 0 && c->data.length + length > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError,
                        "an Arrow binary column would pass 2 GiB: finish() the builder first");
        return -1;
    }
    if (c->offsets.length == 0) {
        if (grow(&c->offsets, 4) < 0) {
            return -1;
        }
        const int32_t zero = 0;
        put(&c->offsets, &zero, 4);
    }
    if ((c->count & 7) == 0) {
        if (grow(&c->validity, 1) < 0) {
            return -1;
        }
        c->validity.data[c->validity.length++] = 0;
    }
    if (grow(&c->offsets, 4) < 0 || (length > 0 && grow(&c->data, length) < 0)) {
        return -1;
    }
    if (length >= 0) {
        c->validity.data[c->count >> 3] |= (char)(1 << (c->count & 7));
        put(&c->data, bytes, length);
    }
    const int32_t end = (int32_t)c->data.length;
    put(&c->offsets, &end, 4);
    c->count++;
    return 0;
}

typedef struct {
    Py_ssize_t validity_length, offsets_length, data_length, count;
    char last_validity;
} BinaryMark;

static void
binary_mark(const BinaryColumn *c, BinaryMark *m)
{
    m->validity_length = c->validity.length;
    m->offsets_length = c->offsets.length;
    m->data_length = c->data.length;
    m->count = c->count;
    m->last_validity = c->validity.length ? c->validity.data[c->validity.length - 1] : 0;
}

static void
binary_rollback(BinaryColumn *c, const BinaryMark *m)
{
    c->validity.length = m->validity_length;
    if (m->validity_length) {
        c->validity.data[m->validity_length - 1] = m->last_validity;
    }
    c->offsets.length = m->offsets_length;
    c->data.length = m->data_length;
    c->count = m->count;
}

typedef struct {
    PyObject_HEAD
    int include_headers;
    Py_ssize_t rows;
    Growable offsets;     /* int64 per row */
    Growable timestamps;  /* int64 ms per row */
    BinaryColumn keys;
    BinaryColumn values;
    Growable header_list_offsets; /* int32, rows + 1 */
    Growable header_list_validity;
    BinaryColumn header_keys;   /* never null: validity all set, dropped by the caller */
    BinaryColumn header_values;
} ColumnBuilder;

static void
growable_free(Growable *g)
{
    Py_CLEAR(g->array);
    g->data = NULL;
    g->length = g->capacity = 0;
}

static void
binary_free(BinaryColumn *c)
{
    growable_free(&c->validity);
    growable_free(&c->offsets);
    growable_free(&c->data);
    c->count = 0;
}

static void
column_builder_clear(ColumnBuilder *self)
{
    self->rows = 0;
    growable_free(&self->offsets);
    growable_free(&self->timestamps);
    binary_free(&self->keys);
    binary_free(&self->values);
    growable_free(&self->header_list_offsets);
    growable_free(&self->header_list_validity);
    binary_free(&self->header_keys);
    binary_free(&self->header_values);
}

static int
column_builder_init(ColumnBuilder *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"include_headers", NULL};
    int include_headers = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p", keywords, &include_headers)) {
        return -1;
    }
    column_builder_clear(self);
    self->include_headers = include_headers;
    return 0;
}

static void
column_builder_dealloc(ColumnBuilder *self)
{
    column_builder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Append one parsed record's headers: list offset, validity, struct children. */
static int
append_headers(ColumnBuilder *self, const unsigned char *data, const ParsedRecord *rec)
{
    Growable *offsets = &self->header_list_offsets;
    if (offsets->length == 0) {
        if (grow(offsets, 4) < 0) {
            return -1;
        }
        const int32_t zero = 0;
        put(offsets, &zero, 4);
    }
    const Py_ssize_t row = self->rows;
    if ((row & 7) == 0) {
        if (grow(&self->header_list_validity, 1) < 0) {
            return -1;
        }
        self->header_list_validity.data[self->header_list_validity.length++] = 0;
    }
    Reader r = {data, PY_SSIZE_T_MAX, 0, 0};
    Py_ssize_t p = rec->headers_position;
    for (int32_t i = 0; i < rec->header_count; i++) {
        int32_t key_length = 0, value_length = 0;
        (void)read_varint_slow(&r, &p, &key_length); /* validated by parse_headers */
        if (binary_column_append(&self->header_keys, data + p, key_length) < 0) {
            return -1;
        }
        p += key_length;
        (void)read_varint_slow(&r, &p, &value_length);
        if (binary_column_append(&self->header_values, data + p, value_length) < 0) {
            return -1;
        }
        if (value_length > 0) {
            p += value_length;
        }
    }
    if (self->header_keys.count > INT32_MAX || grow(offsets, 4) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_OverflowError, "too many headers for one Arrow batch");
        }
        return -1;
    }
    if (rec->header_count > 0) { /* a record without headers has a null list, as Spark's */
        self->header_list_validity.data[row >> 3] |= (char)(1 << (row & 7));
    }
    const int32_t end = (int32_t)self->header_keys.count;
    put(offsets, &end, 4);
    return 0;
}

PyDoc_STRVAR(append_records_doc,
"append_records(buf, start, end, count, base_offset, base_timestamp, append_time,\n"
"               last_offset_delta, batch_position, min_offset) -> int\n\n"
"Decode the records of buf[start:end] and append those at or after min_offset; return\n"
"how many. All or nothing: a corrupt batch raises CorruptRecordError and appends none.");

static PyObject *
column_builder_append_records(ColumnBuilder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "append_records takes 10 arguments");
        return NULL;
    }
    const Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    const Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    const Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    const Py_ssize_t batch_position = PyLong_AsSsize_t(args[8]);
    const long long min_offset = PyLong_AsLongLong(args[9]);
    BatchFields batch;
    if (PyErr_Occurred() || parse_batch_fields(args[4], args[5], args[6], args[7], &batch) < 0) {
        return NULL;
    }
    Py_buffer view;
    Reader r;
    if (get_records_buffer(args[0], start, end, &view, &r, batch_position) < 0) {
        return NULL;
    }
    /* Where to roll back to if a record turns out corrupt half way through the batch. */
    const Py_ssize_t rows = self->rows;
    const Py_ssize_t offsets_length = self->offsets.length;
    const Py_ssize_t timestamps_length = self->timestamps.length;
    const Py_ssize_t list_offsets_length = self->header_list_offsets.length;
    const Py_ssize_t list_validity_length = self->header_list_validity.length;
    const char list_last_validity =
        list_validity_length ? self->header_list_validity.data[list_validity_length - 1] : 0;
    BinaryMark keys, values, header_keys, header_values;
    binary_mark(&self->keys, &keys);
    binary_mark(&self->values, &values);
    binary_mark(&self->header_keys, &header_keys);
    binary_mark(&self->header_values, &header_values);

    Py_ssize_t pos = 0;
    int32_t previous_delta = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        ParsedRecord rec;
        if (parse_record(&r, &pos, &batch, &previous_delta, &rec) < 0) {
            goto error;
        }
        if (rec.offset < min_offset) {
            continue;
        }
        if (grow(&self->offsets, 8) < 0 || grow(&self->timestamps, 8) < 0) {
            goto error;
        }
        put(&self->offsets, &rec.offset, 8);
        put(&self->timestamps, &rec.timestamp, 8);
        if (binary_column_append(&self->keys, r.data + rec.key_position, rec.key_length) < 0 ||
            binary_column_append(&self->values, r.data + rec.value_position,
                                 rec.value_length) < 0) {
            goto error;
        }
        if (self->include_headers && append_headers(self, r.data, &rec) < 0) {
            goto error;
        }
        self->rows++;
    }
    if (check_trailing(&r, pos, count) < 0) {
        goto error;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(self->rows - rows);
error:
    PyBuffer_Release(&view);
    self->rows = rows;
    self->offsets.length = offsets_length;
    self->timestamps.length = timestamps_length;
    self->header_list_offsets.length = list_offsets_length;
    self->header_list_validity.length = list_validity_length;
    if (list_validity_length) {
        self->header_list_validity.data[list_validity_length - 1] = list_last_validity;
    }
    binary_rollback(&self->keys, &keys);
    binary_rollback(&self->values, &values);
    binary_rollback(&self->header_keys, &header_keys);
    binary_rollback(&self->header_values, &header_values);
    return NULL;
}

/* The buffer as a bytearray of its used length, handed over; the Growable is left empty. */
static PyObject *
growable_bytes(Growable *g)
{
    if (g->array == NULL) {
        return PyByteArray_FromStringAndSize("", 0);
    }
    PyObject *array = g->array;
    if (PyByteArray_Resize(array, g->length) < 0) { /* shrinking: in place or a realloc */
        return NULL;
    }
    g->array = NULL;
    g->data = NULL;
    g->length = g->capacity = 0;
    return array;
}

static PyObject *
offsets_bytes(Growable *g) /* an empty column still has its one 0 offset */
{
    if (g->length == 0) {
        const int32_t zero = 0;
        return PyByteArray_FromStringAndSize((const char *)&zero, 4);
    }
    return growable_bytes(g);
}

PyDoc_STRVAR(finish_doc,
"finish() -> tuple\n\n"
"The columns as bytearrays (the builder's own memory, no copy), and an empty builder: (rows, offsets, timestamps, key validity,\n"
"key offsets, key data, value validity, value offsets, value data) and, with headers,\n"
"(header count, list validity, list offsets, header key offsets, header key data,\n"
"header value validity, header value offsets, header value data).");

static PyObject *
column_builder_finish(ColumnBuilder *self, PyObject *unused)
{
    (void)unused;
    PyObject *result;
    if (self->include_headers) {
        result = Py_BuildValue(
            "(nNNNNNNNNnNNNNNNN)", self->rows, growable_bytes(&self->offsets),
            growable_bytes(&self->timestamps), growable_bytes(&self->keys.validity),
            offsets_bytes(&self->keys.offsets), growable_bytes(&self->keys.data),
            growable_bytes(&self->values.validity), offsets_bytes(&self->values.offsets),
            growable_bytes(&self->values.data), self->header_keys.count,
            growable_bytes(&self->header_list_validity),
            offsets_bytes(&self->header_list_offsets), offsets_bytes(&self->header_keys.offsets),
            growable_bytes(&self->header_keys.data),
            growable_bytes(&self->header_values.validity),
            offsets_bytes(&self->header_values.offsets),
            growable_bytes(&self->header_values.data));
    }
    else {
        result = Py_BuildValue(
            "(nNNNNNNNN)", self->rows, growable_bytes(&self->offsets),
            growable_bytes(&self->timestamps), growable_bytes(&self->keys.validity),
            offsets_bytes(&self->keys.offsets), growable_bytes(&self->keys.data),
            growable_bytes(&self->values.validity), offsets_bytes(&self->values.offsets),
            growable_bytes(&self->values.data));
    }
    if (result != NULL) {
        column_builder_clear(self);
    }
    return result;
}

static PyObject *
column_builder_rows(ColumnBuilder *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(self->rows);
}

static PyObject *
column_builder_data_bytes(ColumnBuilder *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(self->keys.data.length + self->values.data.length +
                              self->header_keys.data.length + self->header_values.data.length);
}

static PyObject *
column_builder_last_offset(ColumnBuilder *self, void *closure)
{
    (void)closure;
    if (self->rows == 0) {
        Py_RETURN_NONE;
    }
    int64_t last;
    memcpy(&last, self->offsets.data + self->offsets.length - 8, 8);
    return PyLong_FromLongLong(last);
}

static PyObject *
column_builder_include_headers(ColumnBuilder *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->include_headers);
}

static PyMethodDef column_builder_methods[] = {
    {"append_records", (PyCFunction)(void (*)(void))column_builder_append_records,
     METH_FASTCALL, append_records_doc},
    {"finish", (PyCFunction)column_builder_finish, METH_NOARGS, finish_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef column_builder_getset[] = {
    {"rows", (getter)column_builder_rows, NULL, "rows appended since the last finish()", NULL},
    {"data_bytes", (getter)column_builder_data_bytes, NULL,
     "bytes of keys, values and headers held", NULL},
    {"last_offset", (getter)column_builder_last_offset, NULL,
     "the offset of the last row, or None", NULL},
    {"include_headers", (getter)column_builder_include_headers, NULL,
     "whether headers are collected", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ColumnBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidelog.storage._native.ColumnBuilder",
    .tp_doc = PyDoc_STR("Records into Arrow-layout column buffers. Not thread-safe."),
    .tp_basicsize = sizeof(ColumnBuilder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)column_builder_init,
    .tp_dealloc = (destructor)column_builder_dealloc,
    .tp_methods = column_builder_methods,
    .tp_getset = column_builder_getset,
};

/* --- encode_records_into: the loop of BatchBuilder.extend ---------------------------- */

static inline Py_ssize_t
varint_size(uint64_t zz)
{
    Py_ssize_t n = 1;
    while (zz >= 0x80) {
        zz >>= 7;
        n++;
    }
    return n;
}

static inline unsigned char *
put_unsigned(unsigned char *out, uint64_t zz)
{
    while (zz >= 0x80) {
        *out++ = (unsigned char)((zz & 0x7F) | 0x80);
        zz >>= 7;
    }
    *out++ = (unsigned char)zz;
    return out;
}

static inline uint64_t
zigzag32(int64_t value) /* value within int32 */
{
    const int32_t v = (int32_t)value;
    return (uint32_t)(((uint32_t)v << 1) ^ (uint32_t)(v >> 31));
}

static inline uint64_t
zigzag64(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

/* A key or value: bytes-like or None. `length` -1 for None. */
typedef struct {
    Py_buffer view;
    int held;
    const char *data;
    Py_ssize_t length;
} Field;

static int
field_get(PyObject *object, Field *f)
{
    f->held = 0;
    if (object == Py_None) {
        f->data = NULL;
        f->length = -1;
        return 0;
    }
    if (PyBytes_CheckExact(object)) {
        f->data = PyBytes_AS_STRING(object);
        f->length = PyBytes_GET_SIZE(object);
    }
    else {
        if (PyObject_GetBuffer(object, &f->view, PyBUF_SIMPLE) < 0) {
            return -1;
        }
        f->held = 1;
        f->data = f->view.buf;
        f->length = f->view.len;
    }
    if (f->length > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "varint value %zd is outside the int32 range",
                     f->length);
        if (f->held) {
            PyBuffer_Release(&f->view);
            f->held = 0;
        }
        return -1;
    }
    return 0;
}

static void
field_release(Field *f)
{
    if (f->held) {
        PyBuffer_Release(&f->view);
        f->held = 0;
    }
}

/* Bytes the encoded headers take (count varint included); -1 with an exception set, -2
   (no exception) if a header is not a 2-tuple. */
static Py_ssize_t
headers_size(PyObject *headers_fast)
{
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(headers_fast);
    if (count > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many headers");
        return -1;
    }
    Py_ssize_t size = varint_size(zigzag32(count));
    PyObject **items = PySequence_Fast_ITEMS(headers_fast);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = items[i];
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            return -2; /* not a 2-tuple: the caller normalises and asks again */
        }
        PyObject *key = PyTuple_GET_ITEM(pair, 0);
        if (!PyUnicode_Check(key)) {
            PyErr_Format(PyExc_TypeError, "a header key must be a str, not %.100s",
                         Py_TYPE(key)->tp_name);
            return -1;
        }
        Py_ssize_t key_length;
        if (PyUnicode_AsUTF8AndSize(key, &key_length) == NULL) {
            return -1;
        }
        Field value;
        if (key_length > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a header key is outside the int32 range");
            return -1;
        }
        if (field_get(PyTuple_GET_ITEM(pair, 1), &value) < 0) {
            return -1;
        }
        size += varint_size(zigzag32(key_length)) + key_length;
        size += value.length < 0 ? 1 : varint_size(zigzag32(value.length)) + value.length;
        field_release(&value);
    }
    return size;
}

static PyObject *
normalise_headers(PyObject *headers_fast)
{
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(headers_fast);
    PyObject *pairs = PyList_New(count);
    for (Py_ssize_t i = 0; pairs != NULL && i < count; i++) {
        PyObject *pair = PySequence_Tuple(PySequence_Fast_GET_ITEM(headers_fast, i));
        if (pair != NULL && PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_ValueError, "a header must be a (key, value) pair, not %zd items",
                         PyTuple_GET_SIZE(pair));
            Py_CLEAR(pair);
        }
        if (pair == NULL) {
            Py_CLEAR(pairs);
            break;
        }
        PyList_SET_ITEM(pairs, i, pair);
    }
    return pairs;
}

static unsigned char *
put_headers(unsigned char *out, PyObject *headers_fast) /* after headers_size succeeded */
{
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(headers_fast);
    out = put_unsigned(out, zigzag32(count));
    PyObject **items = PySequence_Fast_ITEMS(headers_fast);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = items[i];
        Py_ssize_t key_length;
        const char *key = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &key_length);
        out = put_unsigned(out, zigzag32(key_length));
        memcpy(out, key, (size_t)key_length);
        out += key_length;
        Field value;
        (void)field_get(PyTuple_GET_ITEM(pair, 1), &value); /* succeeded in headers_size */
        if (value.length < 0) {
            *out++ = 0x01;
        }
        else {
            out = put_unsigned(out, zigzag32(value.length));
            memcpy(out, value.data, (size_t)value.length);
            out += value.length;
        }
        field_release(&value);
    }
    return out;
}

PyDoc_STRVAR(encode_records_into_doc,
"encode_records_into(out, timestamps, keys, values, headers, base_timestamp, first_delta)\n\n"
"Append the records to the bytearray out, at offset deltas first_delta, first_delta + 1,\n"
"...: the loop of BatchBuilder.extend. The caller has checked the columns' lengths, the\n"
"timestamps' range and the deltas. Raises ValueError or TypeError as the pure loop does;\n"
"then out is left as it was.");

static PyObject *
encode_records_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "encode_records_into takes 7 arguments");
        return NULL;
    }
    PyObject *out = args[0];
    if (!PyByteArray_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a bytearray");
        return NULL;
    }
    const long long base = PyLong_AsLongLong(args[5]);
    const long long first_delta = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *timestamps = PySequence_Fast(args[1], "timestamps must be a sequence");
    PyObject *keys = PySequence_Fast(args[2], "keys must be a sequence");
    PyObject *values = PySequence_Fast(args[3], "values must be a sequence");
    PyObject *headers = PySequence_Fast(args[4], "headers must be a sequence");
    const Py_ssize_t original = PyByteArray_GET_SIZE(out);
    PyObject *result = NULL;
    if (!timestamps || !keys || !values || !headers) {
        goto done;
    }
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(timestamps);
    if (PySequence_Fast_GET_SIZE(keys) != count || PySequence_Fast_GET_SIZE(values) != count ||
        PySequence_Fast_GET_SIZE(headers) != count) {
        PyErr_SetString(PyExc_ValueError, "the columns must have the same length");
        goto done;
    }
    if (first_delta < 0 || first_delta + count - 1 > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "offset delta exceeds int32");
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int overflow;
        const long long timestamp =
            PyLong_AsLongLongAndOverflow(PySequence_Fast_GET_ITEM(timestamps, i), &overflow);
        if (timestamp == -1 && PyErr_Occurred()) {
            goto fail;
        }
        long long timestamp_delta;
        if (overflow || __builtin_sub_overflow(timestamp, base, &timestamp_delta)) {
            PyErr_SetString(PyExc_ValueError, "a timestamp delta is outside the int64 range");
            goto fail;
        }
        PyObject *record_headers = PySequence_Fast_GET_ITEM(headers, i);
        const int has_headers = PyObject_IsTrue(record_headers);
        if (has_headers < 0) {
            goto fail;
        }
        Field key, value;
        if (field_get(PySequence_Fast_GET_ITEM(keys, i), &key) < 0) {
            goto fail;
        }
        if (field_get(PySequence_Fast_GET_ITEM(values, i), &value) < 0) {
            field_release(&key);
            goto fail;
        }
        PyObject *headers_fast = NULL;
        Py_ssize_t header_size = 1;
        if (has_headers) {
            headers_fast = PySequence_Fast(record_headers, "headers must be a sequence");
            header_size = headers_fast ? headers_size(headers_fast) : -1;
            if (header_size == -2) {
                /* Pairs as lists or other sequences: unpack them as the pure loop's
                   `for key, value in headers` does, into a list of 2-tuples. */
                PyObject *pairs = normalise_headers(headers_fast);
                Py_SETREF(headers_fast, pairs);
                header_size = pairs ? headers_size(pairs) : -1;
            }
        }
        if (header_size < 0) {
            Py_XDECREF(headers_fast);
            field_release(&key);
            field_release(&value);
            goto fail;
        }
        const uint64_t timestamp_zz = zigzag64(timestamp_delta);
        const uint64_t delta_zz = zigzag32(first_delta + i);
        const Py_ssize_t body =
            1 + varint_size(timestamp_zz) + varint_size(delta_zz) +
            (key.length < 0 ? 1 : varint_size(zigzag32(key.length)) + key.length) +
            (value.length < 0 ? 1 : varint_size(zigzag32(value.length)) + value.length) +
            header_size;
        const Py_ssize_t size = PyByteArray_GET_SIZE(out);
        if (body > INT32_MAX || PyByteArray_Resize(out, size + varint_size(zigzag32(body)) +
                                                             body) < 0) {
            if (body > INT32_MAX) {
                PyErr_Format(PyExc_ValueError, "varint value %zd is outside the int32 range",
                             body);
            }
            Py_XDECREF(headers_fast);
            field_release(&key);
            field_release(&value);
            goto fail;
        }
        unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(out) + size;
        p = put_unsigned(p, zigzag32(body));
        *p++ = 0; /* attributes */
        p = put_unsigned(p, timestamp_zz);
        p = put_unsigned(p, delta_zz);
        if (key.length < 0) {
            *p++ = 0x01;
        }
        else {
            p = put_unsigned(p, zigzag32(key.length));
            memcpy(p, key.data, (size_t)key.length);
            p += key.length;
        }
        if (value.length < 0) {
            *p++ = 0x01;
        }
        else {
            p = put_unsigned(p, zigzag32(value.length));
            memcpy(p, value.data, (size_t)value.length);
            p += value.length;
        }
        if (headers_fast != NULL) {
            p = put_headers(p, headers_fast);
            Py_DECREF(headers_fast);
        }
        else {
            *p++ = 0;
        }
        field_release(&key);
        field_release(&value);
    }
    result = Py_NewRef(Py_None);
    goto done;
fail:
    if (PyByteArray_Resize(out, original) < 0) {
        PyErr_Clear(); /* shrinking cannot fail; keep the first error */
    }
done:
    Py_XDECREF(timestamps);
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(headers);
    return result;
}

/* --- murmur2 -------------------------------------------------------------------------- */

static uint32_t
murmur2_hash(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5BD1E995;
    uint32_t h = 0x9747B28Cu ^ (uint32_t)length;
    const Py_ssize_t words = length >> 2;
    for (Py_ssize_t i = 0; i < words; i++) {
        const unsigned char *w = data + 4 * i;
        uint32_t k = (uint32_t)w[0] | ((uint32_t)w[1] << 8) | ((uint32_t)w[2] << 16) |
                     ((uint32_t)w[3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const Py_ssize_t tail = length & ~(Py_ssize_t)3;
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[tail + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[tail + 1] << 8;
        /* fall through */
    case 1:
        h ^= data[tail];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

PyDoc_STRVAR(murmur2_doc,
"murmur2(data) -> int\n\nKafka's Utils.murmur2 of a bytes-like object, unsigned 32-bit.");

static PyObject *
murmur2(PyObject *module, PyObject *data)
{
    (void)module;
    if (PyBytes_CheckExact(data)) {
        return PyLong_FromUnsignedLong(
            murmur2_hash((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)));
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const uint32_t h = murmur2_hash(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(h);
}

PyDoc_STRVAR(murmur2_partitions_doc,
"murmur2_partitions(keys, partitions) -> list[int]\n\n"
"Kafka's partition of every key: (murmur2(key) & 0x7fffffff) % partitions.");

static PyObject *
murmur2_partitions(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "murmur2_partitions takes 2 arguments");
        return NULL;
    }
    const long partitions = PyLong_AsLong(args[1]);
    if (partitions == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (partitions < 1) {
        PyErr_Format(PyExc_ValueError, "partitions must be >= 1, got %ld", partitions);
        return NULL;
    }
    PyObject *keys = PySequence_Fast(args[0], "keys must be a sequence");
    if (keys == NULL) {
        return NULL;
    }
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(keys);
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        Field key;
        PyObject *item = PySequence_Fast_GET_ITEM(keys, i);
        if (item == Py_None) {
            PyErr_SetString(PyExc_TypeError, "a key must be bytes-like, not None");
            Py_CLEAR(out);
            break;
        }
        if (field_get(item, &key) < 0) {
            Py_CLEAR(out);
            break;
        }
        const uint32_t h = murmur2_hash((const unsigned char *)key.data, key.length);
        field_release(&key);
        PyObject *partition = PyLong_FromLong((long)((h & 0x7FFFFFFFu) % (uint32_t)partitions));
        if (partition == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, partition);
    }
    Py_DECREF(keys);
    return out;
}

/* --- objects the garbage collector need not watch ------------------------------------- */

PyDoc_STRVAR(new_untracked_doc,
"new_untracked(cls) -> object\n\n"
"object.__new__(cls), left out of the garbage collector's lists until track_all.\n"
"The producer's futures: one per record, alive for the milliseconds its batch is in\n"
"flight, holding nothing that could close a cycle until it settles.");

static PyObject *
new_untracked(PyObject *module, PyObject *cls)
{
    (void)module;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "new_untracked takes a class");
        return NULL;
    }
    PyObject *no_args = PyTuple_New(0); /* the empty tuple: a singleton, nothing made */
    if (no_args == NULL) {
        return NULL;
    }
    PyObject *obj = PyBaseObject_Type.tp_new((PyTypeObject *)cls, no_args, NULL);
    Py_DECREF(no_args);
    if (obj != NULL && PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    return obj;
}

PyDoc_STRVAR(track_all_doc,
"track_all(objects) -> None\n\n"
"Hand every untracked collectable object of the list or tuple back to the collector.");

static PyObject *
track_all(PyObject *module, PyObject *objects)
{
    (void)module;
    PyObject *seq = PySequence_Fast(objects, "track_all takes a sequence");
    if (seq == NULL) {
        return NULL;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = items[i];
        /* Tracking a tracked object is a fatal error: ask first. */
        if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
            PyObject_GC_Track(obj);
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* --- the module ----------------------------------------------------------------------- */

static PyMethodDef native_methods[] = {
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL,
     decode_records_doc},
    {"encode_records_into", (PyCFunction)(void (*)(void))encode_records_into, METH_FASTCALL,
     encode_records_into_doc},
    {"murmur2", (PyCFunction)murmur2, METH_O, murmur2_doc},
    {"new_untracked", (PyCFunction)new_untracked, METH_O, new_untracked_doc},
    {"track_all", (PyCFunction)track_all, METH_O, track_all_doc},
    {"murmur2_partitions", (PyCFunction)(void (*)(void))murmur2_partitions, METH_FASTCALL,
     murmur2_partitions_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidelog.storage._native",
    .m_doc = "The record codec's hot loops in C; storage.records is the reference.",
    .m_size = -1,
    .m_methods = native_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *errors = PyImport_ImportModule("tidelog.storage.errors");
    if (errors == NULL) {
        return NULL;
    }
    CorruptRecordError = PyObject_GetAttrString(errors, "CorruptRecordError");
    Py_DECREF(errors);
    if (CorruptRecordError == NULL) {
        return NULL;
    }
    if (PyType_Ready(&ColumnBuilderType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "ColumnBuilder", (PyObject *)&ColumnBuilderType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
