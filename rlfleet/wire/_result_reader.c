/* A result message's header and chunk read in one call (rlfleet.wire._result_reader).
 *
 * rlfleet.wire.result_message reads every result a worker sends (on the
 * coordinator) and every result frame a learner receives with these two
 * functions. They accept a message only in protobuf's own form: fields in
 * ascending order, each once, none at its default, the episode columns
 * packed, every varint in its shortest form; the values they return then mean
 * exactly what protobuf reads from those bytes. Anything else returns None
 * and the caller takes protobuf's general path, which reads it or refuses it
 * with its own text (tests/test_result_message.py holds both to the same
 * answers).
 *
 * On a learner's results connection, read_frame_made given its answer's
 * context also takes a one-chunk result whose worker's kept plan views it
 * (taken): the checks and the ViewedResult the reader's Python path would
 * make, in the same call. Anything it does not take, or any error on the
 * way, returns what it returns without the context, and the Python path
 * reads it again and says what it says (tests/test_learner_frame_take.py).
 *
 * Every byte is network input: each read is bounds-checked against the end of
 * the field it belongs to, lengths are compared without adding to offsets (no
 * overflow), varints stop at 10 bytes, and a value past 64 bits is refused.
 * The buffer is held only for the call (released on every path) and nothing
 * runs Python code while it is held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>

/* EpisodeResult (worker.proto) field numbers. */
enum {
    TASK_ID = 1,
    EPISODE_INDICES = 2,
    LENGTHS = 3,
    AGENT_VERSION = 4,
    ENV_GENERATION = 5,
    WORKER_ID = 6,
    CHUNK = 7,
};
/* BatchChunk (batch.proto) field numbers: batch_id 1 .. kind 5, then data. */
enum { CHUNK_KIND = 5, CHUNK_DATA = 6 };

enum { WIRE_VARINT = 0, WIRE_LEN = 2 };
#define WORKER_RESULT_TAG 0x22 /* WorkerMessage.result (4), length-delimited */
#define SAMPLE_RESULT_TAG 0x12 /* SampleResponse.result (2), length-delimited */
/* SampleResponse.result_call (41), a varint: a two-byte key. */
#define RESULT_CALL_KEY0 0xc8
#define RESULT_CALL_KEY1 0x02

#define UINT32_LIMIT (UINT64_C(1) << 32)
#define INT32_LIMIT (UINT64_C(1) << 31)
#define INT64_LIMIT (UINT64_C(1) << 63)

/* The varint at p[pos] (reading no further than end) into *value, the offset
 * after it into *next. Returns 0, or -1 if it is truncated, longer than 10
 * bytes, not in its shortest form (a last byte of 0 after a continuation
 * byte) or 2**64 or more. */
static inline int read_varint(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, uint64_t *value,
                              Py_ssize_t *next) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (pos >= end) return -1;
        uint8_t byte = p[pos++];
        if (i == 9 && byte > 1) return -1; /* bits past the 64th, or an 11th byte */
        v |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (byte < 0x80) {
            if (byte == 0 && i > 0) return -1;
            *value = v;
            *next = pos;
            return 0;
        }
    }
    return -1;
}

/* A packed int64 column in p[pos:end]: its number of values, or -1 if a varint
 * is truncated, longer than it needs or negative (2**63 or more: protobuf's
 * general path reads those). */
static Py_ssize_t column_count(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end) {
    Py_ssize_t count = 0;
    while (pos < end) {
        if (p[pos] < 0x80) { /* one byte (a result's lengths up to 127 steps) */
            pos++;
        } else {
            uint64_t value;
            if (read_varint(p, pos, end, &value, &pos) < 0 || value >= INT64_LIMIT) return -1;
        }
        count++;
    }
    return count;
}

/* The column column_count checked, as a tuple of ints (NULL with an error set). */
static PyObject *column_tuple(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t count) {
    PyObject *out = PyTuple_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t value = p[pos];
        if (value < 0x80)
            pos++;
        else
            (void)read_varint(p, pos, end, &value, &pos); /* checked by column_count */
        PyObject *item = PyLong_FromLongLong((long long)value);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, item);
    }
    return out;
}

/* What read_result finds: the header's fields and where its parts are. */
typedef struct {
    uint64_t scalars[WORKER_ID + 1]; /* by field number: task_id, -, -, agent_version, ... */
    Py_ssize_t column_start[LENGTHS + 1], column_end[LENGTHS + 1], column_count[LENGTHS + 1];
    Py_ssize_t body_start, chunk_at, end; /* the result's fields, its chunk's key, its end */
    uint64_t chunk[CHUNK_KIND];           /* batch_id, index, count, total_bytes, kind */
    Py_ssize_t data_start, data_end;      /* the chunk's data (equal when it has none) */
} Result;

/* The smaller of a and b. */
static inline Py_ssize_t least(Py_ssize_t a, Py_ssize_t b) { return a < b ? a : b; }

/* The BatchChunk in p[pos:end] into r->chunk and r->data_*: 0, or -1 for
 * anything not in protobuf's own form or out of a field's range. Only
 * p[0:avail] is read (past it lies a frame's data passed apart, which only
 * the chunk's data field may span). */
static int read_chunk(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t avail,
                      Result *r) {
    int last = 0;
    while (pos < end) {
        if (pos >= avail) return -1;
        uint8_t key = p[pos];
        int number = key >> 3;
        if (key >= 0x80 || number <= last || number > CHUNK_DATA) return -1;
        uint64_t value;
        Py_ssize_t next;
        if (read_varint(p, pos + 1, least(end, avail), &value, &next) < 0 || value == 0) return -1;
        if (number == CHUNK_DATA) {
            /* The data is the chunk's last field and reaches its end. */
            if ((key & 7) != WIRE_LEN || value != (uint64_t)(end - next)) return -1;
            r->data_start = next;
            r->data_end = end;
            pos = end;
        } else {
            if ((key & 7) != WIRE_VARINT) return -1;
            r->chunk[number - 1] = value;
            pos = next;
        }
        last = number;
    }
    uint64_t index = r->chunk[1], count = r->chunk[2], total_bytes = r->chunk[3];
    /* Protobuf would cut these to 32 bits: its general path reads them. */
    if (index >= UINT32_LIMIT || count >= UINT32_LIMIT || r->chunk[CHUNK_KIND - 1] >= INT32_LIMIT)
        return -1;
    if (index >= count || (uint64_t)(r->data_end - r->data_start) > total_bytes) return -1;
    return 0;
}

/* The EpisodeResult field (key tag) at the start of p[0:size] into *r: 0, or
 * -1 for anything not in protobuf's own form. Only p[0:avail] is read
 * (avail <= size; read_chunk says why). */
static int read_result(const uint8_t *p, Py_ssize_t size, Py_ssize_t avail, uint8_t tag,
                       Result *r) {
    memset(r, 0, sizeof *r);
    if (size < 2 || avail < 2 || p[0] != tag) return -1;
    uint64_t length;
    Py_ssize_t pos;
    if (read_varint(p, 1, least(size, avail), &length, &pos) < 0 ||
        length > (uint64_t)(size - pos))
        return -1;
    Py_ssize_t end = pos + (Py_ssize_t)length;
    r->body_start = pos;
    r->end = end;
    int last = 0, chunk_seen = 0;
    while (pos < end) {
        if (pos >= avail) return -1;
        uint8_t key = p[pos];
        int number = key >> 3;
        if (key >= 0x80 || number <= last || number > CHUNK) return -1;
        uint64_t value;
        Py_ssize_t next;
        /* 0: protobuf omits a zero scalar and an empty column or chunk. */
        if (read_varint(p, pos + 1, least(end, avail), &value, &next) < 0 || value == 0) return -1;
        if (number == EPISODE_INDICES || number == LENGTHS || number == CHUNK) {
            if ((key & 7) != WIRE_LEN || value > (uint64_t)(end - next)) return -1;
            Py_ssize_t field_end = next + (Py_ssize_t)value;
            if (number == CHUNK) {
                r->chunk_at = pos;
                if (read_chunk(p, next, field_end, avail, r) < 0) return -1;
                chunk_seen = 1;
            } else {
                if (field_end > avail) return -1;
                Py_ssize_t count = column_count(p, next, field_end);
                if (count < 0) return -1;
                r->column_start[number] = next;
                r->column_end[number] = field_end;
                r->column_count[number] = count;
            }
            pos = field_end;
        } else {
            if ((key & 7) != WIRE_VARINT) return -1;
            r->scalars[number] = value;
            pos = next;
        }
        last = number;
    }
    return chunk_seen ? 0 : -1; /* a result without its chunk: the general path says so */
}

/* The names of ResultHeader's fields and of Chunk's but its data, in the
 * order read_result's values are given (interned when the module loads). */
static const char *const HEADER_NAMES[] = {
    "task_id", "worker_id", "episode_indices", "lengths", "agent_version", "env_generation", "wire",
};
/* Chunk's names end with its data, which the dicts of the chunk's fields leave out. */
static const char *const CHUNK_NAMES[] = {"batch_id", "index", "count", "total_bytes", "kind",
                                          "data"};
#define HEADER_FIELDS ((int)(sizeof HEADER_NAMES / sizeof *HEADER_NAMES))
#define CHUNK_FIELDS ((int)(sizeof CHUNK_NAMES / sizeof *CHUNK_NAMES) - 1)
static PyObject *header_keys[HEADER_FIELDS], *chunk_keys[CHUNK_FIELDS + 1];
/* memoryview's toreadonly and () (made when the module loads). */
static PyObject *toreadonly_name, *empty_args;

/* out (a new empty dict, or NULL with an error set) holding keys[i]: values[i]
 * (NULL with an error set if a value is NULL or it cannot be filled). Takes
 * out's and the values' references on every path. */
static PyObject *fields_dict(PyObject *out, PyObject *const *keys, PyObject **values, int n) {
    for (int i = 0; i < n; i++) {
        if (out != NULL && (values[i] == NULL || PyDict_SetItem(out, keys[i], values[i]) < 0))
            Py_CLEAR(out);
    }
    for (int i = 0; i < n; i++) Py_XDECREF(values[i]);
    return out;
}

/* The header's and the chunk's fields of *r, in HEADER_NAMES' and CHUNK_NAMES'
 * order, into head and piece: new references, NULL where one could not be
 * made (an error set). keep_wire: the header's wire is the result's fields
 * before its chunk on chunk 0, else empty. */
static void fields_values(const uint8_t *p, const Result *r, int keep_wire, PyObject **head,
                          PyObject **piece) {
    head[0] = PyLong_FromUnsignedLongLong(r->scalars[TASK_ID]);
    head[1] = PyLong_FromUnsignedLongLong(r->scalars[WORKER_ID]);
    head[2] = column_tuple(p, r->column_start[EPISODE_INDICES], r->column_end[EPISODE_INDICES],
                           r->column_count[EPISODE_INDICES]);
    head[3] = column_tuple(p, r->column_start[LENGTHS], r->column_end[LENGTHS],
                           r->column_count[LENGTHS]);
    head[4] = PyLong_FromLongLong((long long)(int64_t)r->scalars[AGENT_VERSION]);
    head[5] = PyLong_FromUnsignedLongLong(r->scalars[ENV_GENERATION]);
    if (keep_wire && r->chunk[1] == 0)
        head[6] = PyBytes_FromStringAndSize((const char *)p + r->body_start,
                                            r->chunk_at - r->body_start);
    else
        head[6] = PyBytes_FromStringAndSize(NULL, 0);
    for (int i = 0; i < CHUNK_FIELDS; i++) piece[i] = PyLong_FromUnsignedLongLong(r->chunk[i]);
}

/* The header's and the chunk's fields of *r as dicts by name, into *header and
 * *chunk: 0, or -1 with an error set (neither made). keep_wire: as
 * fields_values's. */
static int fields_dicts(const uint8_t *p, const Result *r, int keep_wire, PyObject **header,
                        PyObject **chunk) {
    PyObject *head[HEADER_FIELDS], *piece[CHUNK_FIELDS];
    fields_values(p, r, keep_wire, head, piece);
    *header = fields_dict(PyDict_New(), header_keys, head, HEADER_FIELDS);
    *chunk = fields_dict(PyDict_New(), chunk_keys, piece, CHUNK_FIELDS);
    if (*header == NULL || *chunk == NULL) {
        Py_CLEAR(*header);
        Py_CLEAR(*chunk);
        return -1;
    }
    return 0;
}

/* What the module's functions return for *r: (header fields, chunk fields,
 * data_start, data_end), then the call if with_call (NULL with an error
 * set). keep_wire: as fields_dicts's. */
static PyObject *result_tuple(const uint8_t *p, const Result *r, int keep_wire, int with_call,
                              uint64_t call) {
    PyObject *items[5];
    int n = 2;
    if (fields_dicts(p, r, keep_wire, &items[0], &items[1]) < 0) return NULL;
    items[n++] = PyLong_FromSsize_t(r->data_start);
    items[n++] = PyLong_FromSsize_t(r->data_end);
    if (with_call) items[n++] = PyLong_FromUnsignedLongLong(call);
    PyObject *out = PyTuple_New(n);
    int made = out != NULL;
    for (int i = 0; i < n; i++) made = made && items[i] != NULL;
    if (!made) {
        Py_XDECREF(out);
        for (int i = 0; i < n; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++) PyTuple_SET_ITEM(out, i, items[i]);
    return out;
}

PyDoc_STRVAR(read_message_doc,
"read_message(data, /)\n--\n\n"
"A serialized WorkerMessage holding only a result, in protobuf's own form:\n"
"(ResultHeader's fields, Chunk's fields but its data, data_start, data_end), the\n"
"fields as dicts by name, wire being the result's fields before its chunk on chunk 0\n"
"(else b''); None for any other message.\n"
"data: any contiguous buffer.");

static PyObject *read_message(PyObject *module, PyObject *data) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    Result r;
    PyObject *out;
    if (read_result(p, view.len, view.len, WORKER_RESULT_TAG, &r) < 0 || r.end != view.len)
        out = Py_NewRef(Py_None);
    else
        out = result_tuple(p, &r, 1, 0, 0);
    PyBuffer_Release(&view);
    return out;
}

/* The call's number (SampleResponse.result_call) in p[pos:size], which it
 * fills, into *call: 0, or -1 if it is not there in protobuf's own form or
 * is 0 (protobuf omits it). */
static int read_call(const uint8_t *p, Py_ssize_t pos, Py_ssize_t size, uint64_t *call) {
    Py_ssize_t end;
    if (size - pos < 3 || p[pos] != RESULT_CALL_KEY0 || p[pos + 1] != RESULT_CALL_KEY1 ||
        read_varint(p, pos + 2, size, call, &end) < 0 || *call == 0 || end != size)
        return -1;
    return 0;
}

PyDoc_STRVAR(read_frame_doc,
"read_frame(data, /)\n--\n\n"
"A learner's results-connection frame (a SampleResponse: its result, then its\n"
"result_call) in protobuf's own form: what read_message returns (wire b''), then the\n"
"result_call; None for any other frame.\n"
"data: any contiguous buffer.");

static PyObject *read_frame(PyObject *module, PyObject *data) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    Py_ssize_t size = view.len;
    Result r;
    uint64_t call;
    PyObject *out;
    /* The call's number follows the result and ends the frame. */
    if (read_result(p, size, size, SAMPLE_RESULT_TAG, &r) < 0 ||
        read_call(p, r.end, size, &call) < 0)
        out = Py_NewRef(Py_None);
    else
        out = result_tuple(p, &r, 0, 1, call);
    PyBuffer_Release(&view);
    return out;
}

/* An instance of type (a dataclass without slots) holding values[i] as its
 * attribute keys[i], made as object.__new__(type) with no __init__ (NULL with
 * an error set if a value is NULL or the instance cannot be made). The
 * attributes are set past the type's __setattr__ (a frozen dataclass's
 * refuses), in the instance's own storage as its __init__ would set them: no
 * dict. Takes the values' references on every path. */
static PyObject *instance_of(PyTypeObject *type, PyObject *const *keys, PyObject **values, int n) {
    PyObject *made = PyBaseObject_Type.tp_new(type, empty_args, NULL);
    for (int i = 0; i < n; i++) {
        if (made != NULL && (values[i] == NULL || PyObject_GenericSetAttr(made, keys[i], values[i]) < 0))
            Py_CLEAR(made);
    }
    for (int i = 0; i < n; i++) Py_XDECREF(values[i]);
    return made;
}

/* A read-only byte view of data[start:end] (data: a contiguous buffer of
 * bytes, or a memoryview of one), as the general path's chunk holds; b""
 * when end == start. Py_NotImplemented for a memoryview of other items (its
 * caller casts it first). NULL with an error set. */
static PyObject *data_view(PyObject *data, Py_ssize_t start, Py_ssize_t end) {
    if (end <= start) return PyBytes_FromStringAndSize(NULL, 0);
    PyObject *whole = PyMemoryView_Check(data) ? Py_NewRef(data) : PyMemoryView_FromObject(data);
    if (whole == NULL) return NULL;
    const Py_buffer *held = PyMemoryView_GET_BUFFER(whole);
    if (held->ndim != 1 || (held->format != NULL && strcmp(held->format, "B") != 0) ||
        held->len < end) {
        Py_DECREF(whole);
        return Py_NewRef(Py_NotImplemented);
    }
    PyObject *piece = PySequence_GetSlice(whole, start, end);
    Py_DECREF(whole);
    if (piece == NULL) return NULL;
    /* What toreadonly() makes of the slice, without the second view: the slice
     * is a new view of its own (not shared), so marking it read-only is all
     * toreadonly() changes; a writable buffer is then refused as toreadonly's. */
    if (!PyMemoryView_Check(piece) || Py_REFCNT(piece) != 1) {
        PyObject *out = PyObject_CallMethodNoArgs(piece, toreadonly_name);
        Py_DECREF(piece);
        return out;
    }
    PyMemoryView_GET_BUFFER(piece)->readonly = 1;
    return piece;
}

/* names[i] interned into keys[i] where not yet: 0, or -1 with an error set. */
static int intern_names(const char *const *names, PyObject **keys, int n) {
    for (int i = 0; i < n; i++) {
        if (keys[i] == NULL && (keys[i] = PyUnicode_InternFromString(names[i])) == NULL) return -1;
    }
    return 0;
}

/* A learner's result taken in read_frame_made's call (taken), with its context. */
#include "_result_take.h"

/* What read_frame_made and read_message_made return for data, read with tag:
 * (result_call, header, chunk) with with_call, else (header, chunk). keep_wire:
 * as fields_values's. */
static PyObject *read_made(PyObject *const *args, Py_ssize_t nargs, const char *name, uint8_t tag,
                           int with_call) {
    if (nargs < 3 || nargs > 3 + with_call || !PyType_Check(args[1]) || !PyType_Check(args[2])) {
        PyErr_Format(PyExc_TypeError, "%s expected a buffer and two types as arguments", name);
        return NULL;
    }
    PyObject *ctx = nargs == 4 && args[3] != Py_None ? args[3] : NULL;
    if (ctx != NULL &&
        (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != TAKE_ITEMS ||
         !PyLong_Check(PyTuple_GET_ITEM(ctx, TAKE_CALL)) ||
         !PyType_Check(PyTuple_GET_ITEM(ctx, TAKE_VIEWED_TYPE)) ||
         !PyLong_Check(PyTuple_GET_ITEM(ctx, TAKE_KIND)) ||
         !PyDict_Check(PyTuple_GET_ITEM(ctx, TAKE_PARTIAL)) ||
         !PyDict_Check(PyTuple_GET_ITEM(ctx, TAKE_LAYOUTS)) ||
         !PyCallable_Check(PyTuple_GET_ITEM(ctx, TAKE_CHECK)))) {
        PyErr_Format(PyExc_TypeError, "%s expected a context of %d items", name, TAKE_ITEMS);
        return NULL;
    }
    PyObject *data = args[0];
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    Result r;
    uint64_t call = 0;
    /* The chunk's fields, then its data. */
    PyObject *head[HEADER_FIELDS], *piece[CHUNK_FIELDS + 1];
    int read = read_result(p, view.len, view.len, tag, &r) == 0 &&
               (with_call ? read_call(p, r.end, view.len, &call) == 0 : r.end == view.len);
    /* A worker's message keeps its fields before the chunk (wire), as read_message. */
    if (read) fields_values(p, &r, !with_call, head, piece);
    /* No Python code runs while the buffer is held: the views are made after. */
    PyBuffer_Release(&view);
    if (!read) return Py_NewRef(Py_None);
    piece[CHUNK_FIELDS] = data_view(data, r.data_start, r.data_end);
    if (piece[CHUNK_FIELDS] == Py_NotImplemented) {
        for (int i = 0; i < HEADER_FIELDS; i++) Py_XDECREF(head[i]);
        for (int i = 0; i < CHUNK_FIELDS + 1; i++) Py_XDECREF(piece[i]);
        return Py_NewRef(Py_NotImplemented);
    }
    /* Borrowed: the header and the chunk hold them once made. */
    PyObject *worker = head[1], *lengths = head[3], *data_piece = piece[CHUNK_FIELDS];
    PyObject *items[3];
    int n = 0;
    if (with_call) items[n++] = PyLong_FromUnsignedLongLong(call);
    items[n++] = instance_of((PyTypeObject *)args[1], header_keys, head, HEADER_FIELDS);
    items[n++] = instance_of((PyTypeObject *)args[2], chunk_keys, piece, CHUNK_FIELDS + 1);
    PyObject *out = NULL;
    int made = 1;
    for (int i = 0; i < n; i++) made = made && items[i] != NULL;
    if (made && ctx != NULL) {
        out = taken(ctx, &r, call, items[1], items[2], worker, lengths, data_piece);
        if (out != NULL) {
            for (int i = 0; i < n; i++) Py_DECREF(items[i]);
            return out;
        }
    }
    if (made) out = PyTuple_New(n);
    if (out == NULL) {
        for (int i = 0; i < n; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++) PyTuple_SET_ITEM(out, i, items[i]);
    return out;
}

PyDoc_STRVAR(read_frame_made_doc,
"read_frame_made(data, header_type, chunk_type, context=None, /)\n--\n\n"
"What read_frame reads, made: (result_call, header, chunk), header an instance of\n"
"header_type and chunk one of chunk_type (dataclasses without slots) made with\n"
"their fields as their __dict__, no __init__ run, the chunk's data a read-only\n"
"memoryview of data's bytes (b\"\" when it has none); None for any frame read_frame\n"
"leaves; NotImplemented where data is a memoryview of other items than bytes.\n"
"data: any contiguous buffer.\n"
"context: (call, viewed_type, kind, max_total_bytes, partial, views, layouts, spec,\n"
"view_check, assembler): the frame's result, taken as ResultAssembler.whole and\n"
"ResultLayoutViews.view take it, where it is of that call and its worker's kept plan\n"
"views it with uint8 step types (both updated as they update them); else as above.");

static PyObject *read_frame_made(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return read_made(args, nargs, "read_frame_made", SAMPLE_RESULT_TAG, 1);
}

PyDoc_STRVAR(read_message_made_doc,
"read_message_made(data, header_type, chunk_type, /)\n--\n\n"
"What read_message reads, made as read_frame_made makes a frame's: (header, chunk),\n"
"the header's wire the result's fields before its chunk on chunk 0 (else b''); None\n"
"for any message read_message leaves; NotImplemented where data is a memoryview of\n"
"other items than bytes.\n"
"data: any contiguous buffer.");

static PyObject *read_message_made(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return read_made(args, nargs, "read_message_made", WORKER_RESULT_TAG, 0);
}

PyDoc_STRVAR(read_frame_pieces_doc,
"read_frame_pieces(head, data, tail, /)\n--\n\n"
"What read_frame returns for the frame head + data + tail, read where its pieces\n"
"lie, when data is exactly its chunk's data (data_start and data_end then count\n"
"within data); None otherwise, and for any frame read_frame leaves. data's bytes\n"
"are not read.\n"
"head, data, tail: any contiguous buffers.");

static PyObject *read_frame_pieces(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "read_frame_pieces expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    Py_buffer views[3];
    int held = 0;
    while (held < 3 && PyObject_GetBuffer(args[held], &views[held], PyBUF_SIMPLE) == 0) held++;
    PyObject *out = NULL;
    if (held == 3) {
        const uint8_t *head = views[0].buf;
        Py_ssize_t head_size = views[0].len, data_size = views[1].len;
        Result r;
        uint64_t call;
        /* Only the head is read: the result ends where the data does, and the
         * chunk's data is all of it. */
        if (data_size == 0 || data_size > PY_SSIZE_T_MAX - head_size ||
            read_result(head, head_size + data_size, head_size, SAMPLE_RESULT_TAG, &r) < 0 ||
            r.data_start != head_size || r.end != head_size + data_size ||
            read_call(views[2].buf, 0, views[2].len, &call) < 0) {
            out = Py_NewRef(Py_None);
        } else {
            r.data_start = 0;
            r.data_end = data_size;
            out = result_tuple(head, &r, 0, 1, call);
        }
    }
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    return out;
}

PyDoc_STRVAR(column_summary_doc,
"column_summary(values, /)\n"
"--\n\n"
"A header's column (its lengths) in one pass: (sum, least, greatest), or None\n"
"for anything but a non-empty tuple of ints within int64 whose sum is too\n"
"(the one pass then leaves the result to the general path).");

/* One pass where sum, min and max of Python ints made a rich comparison or
 * an addition per episode each (about 19,000 instructions an 80-episode
 * result's lengths). */
static PyObject *column_summary(PyObject *module, PyObject *values) {
    (void)module;
    if (!PyTuple_CheckExact(values) || PyTuple_GET_SIZE(values) < 1) Py_RETURN_NONE;
    __int128 total = 0; /* any tuple's partial sums fit: only the whole is held to int64 */
    long long least = LLONG_MAX, greatest = LLONG_MIN;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); i++) {
        PyObject *item = PyTuple_GET_ITEM(values, i);
        if (!PyLong_CheckExact(item)) Py_RETURN_NONE; /* no __index__: no Python code runs */
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        total += v;
        if (v < least) least = v;
        if (v > greatest) greatest = v;
    }
    if (total > LLONG_MAX || total < LLONG_MIN) Py_RETURN_NONE;
    return Py_BuildValue("(LLL)", (long long)total, least, greatest);
}

static PyMethodDef module_methods[] = {
    {"column_summary", (PyCFunction)column_summary, METH_O, column_summary_doc},
    {"read_message", (PyCFunction)read_message, METH_O, read_message_doc},
    {"read_frame", (PyCFunction)read_frame, METH_O, read_frame_doc},
    {"read_frame_made", (PyCFunction)(void (*)(void))read_frame_made, METH_FASTCALL,
     read_frame_made_doc},
    {"read_message_made", (PyCFunction)(void (*)(void))read_message_made, METH_FASTCALL,
     read_message_made_doc},
    {"read_frame_pieces", (PyCFunction)(void (*)(void))read_frame_pieces, METH_FASTCALL,
     read_frame_pieces_doc},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module) {
    (void)module;
    if (intern_names(HEADER_NAMES, header_keys, HEADER_FIELDS) < 0 ||
        intern_names(CHUNK_NAMES, chunk_keys, CHUNK_FIELDS + 1) < 0)
        return -1;
    if (toreadonly_name == NULL &&
        (toreadonly_name = PyUnicode_InternFromString("toreadonly")) == NULL)
        return -1;
    if (empty_args == NULL && (empty_args = PyTuple_New(0)) == NULL) return -1;
    if (take_names() < 0) return -1;
    return 0;
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, module_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_result_reader",
    .m_doc = "A result message's header and chunk read in one call (rlfleet.wire.result_message).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__result_reader(void) { return PyModuleDef_Init(&module_def); }
