/* A result layout's skeleton for some numbers of episodes and steps, in one call
 * (rlfleet.wire._skeleton).
 *
 * rlfleet.wire._layout_frames works out, for each new pair of counts, every
 * byte a result of a layout holds around its arrays and where each array's
 * data lies. A per-env worker's results hardly repeat their counts, so the
 * coordinator's one pass does it for nearly every result: about 120 Python
 * calls and 160,000 instructions for an 80-episode CartPole result. Only
 * varints change with the counts (an array's rows and data length, and the
 * lengths of the fields around it), so the layout is turned once into a
 * program of items in the order a writer writes them
 * (rlfleet.wire._skeleton_program), and this call
 * evaluates it: sizes from the last item back (a length-delimited field's
 * length is the sum of the items it spans), then the bytes and offsets
 * forward.
 *
 * The counts come from a result's header (network input): every size is
 * added and multiplied with overflow checks, and a pair of counts whose
 * sizes leave int64 (or are negative) gets None, for the Python builder,
 * which names nothing and works them out with Python's integers. Only the
 * bytes around the arrays are made, never the size of the result. The
 * program is the layout's, built by rlfleet: each item's fields are still
 * checked (kinds, indices, spans) before use, and a bad one is a ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* An item's kind (rlfleet.wire._skeleton_program's _BREAK ... _DATA). */
enum { BREAK = 0, BYTES = 1, COUNT = 2, SPAN = 3, DATA = 4 };
/* An item: kind, rows (0 none, 1 episodes, 2 steps), multiplier, argument,
 * and the row bytes its presence depends on (-1: always present; else only
 * when rows times them is not zero: a Tensor's data tag and length). */
enum { FIELDS = 5 };
/* Items kept on the stack (with their sizes, values and sizes after); a larger
 * program takes the heap. */
enum { STACK_ITEMS = 192 };

/* Number of bytes of a varint of a value >= 0. */
static int64_t varint_size(int64_t value) {
    int64_t size = 1;
    while (value >= 0x80) {
        value >>= 7;
        size++;
    }
    return size;
}

/* Writes the varint of a value >= 0 in the size varint_size gave it (never
 * more bytes than its item was counted for); returns the byte after it. */
static unsigned char *put_varint(unsigned char *out, int64_t value, int64_t size) {
    uint64_t v = (uint64_t)value;
    for (int64_t k = 1; k < size; k++) {
        *out++ = (unsigned char)(v & 0x7F) | 0x80;
        v >>= 7;
    }
    *out++ = (unsigned char)(v & 0x7F);
    return out;
}

/* Whether item k (of n) is well formed (else a ValueError set). */
static int item_valid(const int64_t *item, Py_ssize_t k, Py_ssize_t n, Py_ssize_t pieces,
                      Py_ssize_t names) {
    int64_t kind = item[0], rows = item[1], mult = item[2], arg = item[3], cond = item[4];
    int ok = kind >= BREAK && kind <= DATA && rows >= 0 && rows <= 2 && mult >= 0 && cond >= -1;
    if (kind == BYTES) ok = ok && arg >= 0 && arg < pieces;
    if (kind == SPAN) ok = ok && arg > k && arg <= n;
    if (kind == DATA) ok = ok && arg >= 0 && arg < names;
    if (!ok) PyErr_Format(PyExc_ValueError, "skeleton program's item %zd is not well formed", k);
    return ok;
}

/* The rows of an item for the counts. */
static int64_t rows_of(int64_t rows, int64_t episodes, int64_t steps) {
    return rows == 1 ? episodes : rows == 2 ? steps : 0;
}

/* Each item's size and varint value for the counts, the last item first (a
 * span's value is the size of the items after it up to its end), each item
 * checked before it is used. Returns 1; 0 if a size leaves int64; -1 for an
 * item not well formed (ValueError set). after[k] is the size of items
 * k..n-1; *joined the size of all but the arrays' data. */
static int sizes_of(const int64_t *items, Py_ssize_t n, PyObject *pieces, Py_ssize_t names,
                    int64_t episodes, int64_t steps, int64_t *sizes, int64_t *values,
                    int64_t *after, int64_t *joined) {
    Py_ssize_t piece_count = PyTuple_GET_SIZE(pieces);
    int64_t around = 0;
    after[n] = 0;
    for (Py_ssize_t k = n - 1; k >= 0; k--) {
        const int64_t *item = items + FIELDS * k;
        if (!item_valid(item, k, n, piece_count, names)) return -1;
        int64_t rows = rows_of(item[1], episodes, steps), size = 0, value = 0, product;
        /* Present always, or (a Tensor's data tag and length) only with data. */
        if (__builtin_mul_overflow(rows, item[4] < 0 ? 1 : item[4], &product)) return 0;
        if (item[4] < 0 || product != 0) {
            switch (item[0]) {
            case BYTES:
                size = (int64_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(pieces, item[3]));
                break;
            case COUNT:
                if (__builtin_mul_overflow(rows, item[2], &value)) return 0;
                size = varint_size(value);
                break;
            case SPAN:
                value = after[k + 1] - after[item[3]];
                size = varint_size(value);
                break;
            case DATA:
                if (__builtin_mul_overflow(rows, item[2], &size)) return 0;
                break;
            default:
                break;
            }
        }
        sizes[k] = size;
        values[k] = value;
        if (__builtin_add_overflow(after[k + 1], size, &after[k])) return 0;
        if (item[0] != DATA) around += size; /* at most after[k]: no overflow */
    }
    *joined = around;
    return 1;
}

/* A run's (offset, bytes) pair of the headers. */
static PyObject *header_pair(int64_t offset, const char *run, Py_ssize_t size) {
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) return NULL;
    PyObject *at = PyLong_FromLongLong(offset);
    PyObject *bytes = at == NULL ? NULL : PyBytes_FromStringAndSize(run, size);
    if (bytes == NULL) {
        Py_XDECREF(at);
        Py_DECREF(pair);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, at);
    PyTuple_SET_ITEM(pair, 1, bytes);
    return pair;
}

/* The skeleton's fields from the items' sizes: (size, headers, offsets,
 * between, places), as rlfleet.wire._layout_frames._build_skeleton makes them. */
static PyObject *skeleton_of(const int64_t *items, Py_ssize_t n, PyObject *pieces,
                             PyObject *names, const Py_buffer *placed, const int64_t *sizes,
                             const int64_t *values, int64_t total, int64_t joined) {
    PyObject *between = NULL, *headers = NULL, *offsets = NULL, *places = NULL, *out = NULL;
    PyObject *size = NULL;
    int64_t *data_at = NULL, *runs = NULL;
    Py_ssize_t run_count = 0, name_count = PyTuple_GET_SIZE(names);
    /* The bytes around the arrays, and the runs: a run ends at an array or a block's start. */
    between = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)joined);
    runs = PyMem_Malloc(sizeof(int64_t) * 3 * (size_t)(n + 1));
    data_at = PyMem_Malloc(sizeof(int64_t) * (size_t)(name_count + 1));
    if (between == NULL || runs == NULL || data_at == NULL) {
        if (between != NULL) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < name_count; k++) data_at[k] = -1;
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(between), *write = start;
    int64_t position = 0, run_start = 0, run_from = 0; /* in the result; in between */
    offsets = PyDict_New();
    if (offsets == NULL) goto done;
    static const int64_t end[FIELDS] = {BREAK, 0, 0, 0, -1};
    for (Py_ssize_t k = 0; k <= n; k++) {
        const int64_t *item = k < n ? items + FIELDS * k : end;
        if (item[0] == DATA || item[0] == BREAK) {
            int64_t length = (int64_t)(write - start) - run_from;
            if (length) {
                runs[3 * run_count] = run_start;
                runs[3 * run_count + 1] = length;
                runs[3 * run_count + 2] = run_from;
                run_count++;
            }
            run_from += length;
            if (item[0] == DATA) {
                PyObject *at = PyLong_FromLongLong(position);
                if (at == NULL) goto done;
                int failed = PyDict_SetItem(offsets, PyTuple_GET_ITEM(names, item[3]), at);
                Py_DECREF(at);
                if (failed) goto done;
                data_at[item[3]] = position;
            }
            if (k < n) position += sizes[k];
            run_start = position;
            continue;
        }
        if (item[0] == BYTES) {
            memcpy(write, PyBytes_AS_STRING(PyTuple_GET_ITEM(pieces, item[3])), (size_t)sizes[k]);
            write += sizes[k];
        } else if (sizes[k]) { /* a varint written (absent: no bytes) */
            write = put_varint(write, values[k], sizes[k]);
        }
        position += sizes[k];
    }
    /* The headers: (offset, run) pairs; the places: runs, then the placed arrays' offsets. */
    Py_ssize_t placed_count = placed->len / (Py_ssize_t)sizeof(int64_t);
    headers = PyTuple_New(run_count);
    places = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int64_t) *
                                                 (2 * run_count + placed_count));
    if (headers == NULL || places == NULL) goto done;
    int64_t *place = (int64_t *)PyBytes_AS_STRING(places);
    for (Py_ssize_t r = 0; r < run_count; r++) {
        PyObject *pair = header_pair(runs[3 * r], (const char *)start + runs[3 * r + 2],
                                     (Py_ssize_t)runs[3 * r + 1]);
        if (pair == NULL) goto done;
        PyTuple_SET_ITEM(headers, r, pair);
        place[2 * r] = runs[3 * r];
        place[2 * r + 1] = runs[3 * r + 1];
    }
    for (Py_ssize_t p = 0; p < placed_count; p++) {
        int64_t name;
        memcpy(&name, (const char *)placed->buf + (Py_ssize_t)sizeof(int64_t) * p, sizeof name);
        if (name < 0 || name >= name_count || data_at[name] < 0) {
            out = Py_NewRef(Py_None); /* a placed array the layout lacks: the Python builder's */
            goto done;
        }
        place[2 * run_count + p] = data_at[name];
    }
    size = PyLong_FromLongLong(total);
    if (size == NULL) goto done;
    out = PyTuple_Pack(5, size, headers, offsets, between, places);
done:
    Py_XDECREF(size);
    Py_XDECREF(between);
    Py_XDECREF(headers);
    Py_XDECREF(offsets);
    Py_XDECREF(places);
    PyMem_Free(runs);
    PyMem_Free(data_at);
    return out;
}

PyDoc_STRVAR(skeleton_doc,
             "skeleton(program, pieces, names, placed, episodes, steps)\n"
             "--\n\n"
             "A layout's skeleton fields (size, headers, offsets, between, places) for\n"
             "``episodes`` and ``steps``, as rlfleet.wire._layout_frames._build_skeleton\n"
             "makes them; None where a size leaves int64, a count is negative or a\n"
             "placed array is missing (the Python builder's to work out).\n\n"
             "program: int64 items of five fields\n"
             "(rlfleet.wire._skeleton_program.skeleton_program).\n"
             "pieces: the bytes BYTES items write. names: the arrays' names, by the\n"
             "index DATA items give. placed: int64 indices of the names whose offsets\n"
             "follow the runs in ``places``.");

static PyObject *skeleton(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "skeleton takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *pieces = args[1], *names = args[2];
    if (!PyTuple_Check(pieces) || !PyTuple_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "skeleton's pieces and names must be tuples");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(pieces); k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(pieces, k))) {
            PyErr_SetString(PyExc_TypeError, "skeleton's pieces must be bytes");
            return NULL;
        }
    }
    int overflow_e = 0, overflow_s = 0;
    long long episodes = PyLong_AsLongLongAndOverflow(args[4], &overflow_e);
    if (episodes == -1 && PyErr_Occurred()) return NULL;
    long long steps = PyLong_AsLongLongAndOverflow(args[5], &overflow_s);
    if (steps == -1 && PyErr_Occurred()) return NULL;
    if (overflow_e || overflow_s || episodes < 0 || steps < 0) Py_RETURN_NONE;

    Py_buffer program, placed;
    if (PyObject_GetBuffer(args[0], &program, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[3], &placed, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&program);
        return NULL;
    }
    PyObject *out = NULL;
    int64_t stack[8 * STACK_ITEMS + 1];
    int64_t *work = stack;
    Py_ssize_t width = (Py_ssize_t)sizeof(int64_t) * FIELDS;
    Py_ssize_t n = program.len / width;
    if (program.len % width != 0 || placed.len % (Py_ssize_t)sizeof(int64_t) != 0) {
        PyErr_SetString(PyExc_ValueError,
                        "skeleton's program must be int64 items of five and placed int64s");
        goto done;
    }
    if (n > STACK_ITEMS) {
        work = PyMem_Malloc(sizeof(int64_t) * (size_t)(8 * n + 1));
        if (work == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    /* The items copied once, aligned; then each one's size, value and the sizes after it. */
    int64_t *items = work, *sizes = work + FIELDS * n, *values = sizes + n, *after = values + n;
    int64_t joined = 0;
    memcpy(items, program.buf, (size_t)program.len);
    int sized = sizes_of(items, n, pieces, PyTuple_GET_SIZE(names), episodes, steps, sizes,
                         values, after, &joined);
    if (sized < 0) goto done;
    if (sized == 0) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = skeleton_of(items, n, pieces, names, &placed, sizes, values, after[0], joined);
done:
    if (work != stack) PyMem_Free(work);
    PyBuffer_Release(&placed);
    PyBuffer_Release(&program);
    return out;
}

static PyMethodDef module_methods[] = {
    {"skeleton", (PyCFunction)(void (*)(void))skeleton, METH_FASTCALL, skeleton_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot module_slots[] = {{0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_skeleton",
    .m_doc = "A result layout's skeleton for some numbers of episodes and steps, in one call "
             "(rlfleet.wire._skeleton_program).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__skeleton(void) { return PyModuleDef_Init(&module_def); }
