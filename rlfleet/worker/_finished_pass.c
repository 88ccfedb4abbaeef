/* A native worker's finished episodes taken in one pass over their rows and
 * one over their steps, and their columns gathered a run per episode
 * (rlfleet.worker._finished_pass; used by rlfleet.worker._native_columns).
 *
 * A flush takes every finished episode of a FinishedTable: its flat list of
 * ints (WIDTH per episode) became an array with struct.pack, was ordered by
 * (request, episode index) with np.lexsort and a fancy index, and its step
 * index (split_rows) and step types (step_types_of) took about ten numpy
 * passes over the steps; each column was then gathered with np.take, a step
 * at a time. Here sort_rows reads the list and writes the ordered table;
 * step_index writes each step's flat ring index and step type, and each
 * episode's last observation's index, in one pass; gather_runs copies an
 * episode's rows of a column at once (they lie together in the ring's
 * storage, slot by slot). The numpy code stays the reference
 * (tests/test_finished_pass.py).
 *
 * Checked, whatever the caller: the list holds whole rows of ints that fit
 * int64; each row's length is in [1, capacity], its start >= 0, its slot in
 * [0, n_slots), its last step type in [0, 255] (step_index); every output
 * is a writable C-contiguous buffer that holds what is written. Anything
 * else raises, writing nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A FinishedTable row (rlfleet/worker/_native_columns.py). */
#define WIDTH 10
#define START 0
#define LENGTH 1
#define SLOT 2
#define LAST 3
#define INDEX 7
#define REQUEST 9

/* Step types (rlfleet.core.step_type.StepType). */
#define FIRST 0
#define MID 1

/* A 1-D C-contiguous writable buffer of `itemsize`-byte items, `length` of them. */
static int get_out(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t length,
                   const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    if (view->itemsize != itemsize || view->len != itemsize * length) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd items of %zd bytes (it holds %zd bytes)",
                     name, length, itemsize, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* A row, copied whole (a fixed size: no call). */
typedef struct {
    int64_t v[WIDTH];
} Row;

/* An int64 row's sort key; `pos` (its place in the list) makes the order
 * np.lexsort's, which is stable. */
typedef struct {
    int64_t request, index;
    Py_ssize_t pos;
} Key;

static inline int before(const Key *a, const Key *b) {
    if (a->request != b->request) return a->request < b->request;
    if (a->index != b->index) return a->index < b->index;
    return a->pos < b->pos;
}

/* Bottom-up merge sort of keys[0:n], tmp of n keys as scratch; the sorted
 * keys end in *result (keys or tmp). */
static Key *merge_sort(Key *keys, Key *tmp, Py_ssize_t n) {
    Key *src = keys, *dst = tmp;
    /* Runs of 8 by insertion first: the rows come nearly in order. */
    for (Py_ssize_t lo = 0; lo < n; lo += 8) {
        Py_ssize_t hi = lo + 8 < n ? lo + 8 : n;
        for (Py_ssize_t i = lo + 1; i < hi; i++) {
            Key k = src[i];
            Py_ssize_t j = i;
            while (j > lo && before(&k, &src[j - 1])) {
                src[j] = src[j - 1];
                j--;
            }
            src[j] = k;
        }
    }
    for (Py_ssize_t width = 8; width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            Py_ssize_t mid = lo + width < n ? lo + width : n;
            Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            Py_ssize_t a = lo, b = mid, k = lo;
            if (mid == hi || !before(&src[mid], &src[mid - 1])) {
                /* Already in order (the usual case for near-sorted rows). */
                memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(Key));
                continue;
            }
            while (a < mid && b < hi) dst[k++] = before(&src[b], &src[a]) ? src[b++] : src[a++];
            while (a < mid) dst[k++] = src[a++];
            while (b < hi) dst[k++] = src[b++];
        }
        Key *swap = src;
        src = dst;
        dst = swap;
    }
    return src;
}

PyDoc_STRVAR(sort_rows_doc,
"sort_rows(rows, out) -> None\n"
"\n"
"Writes the FinishedTable rows of the flat list `rows` (10 ints each) into\n"
"`out` (a writable int64 buffer of len(rows) items) in (request, episode\n"
"index) order, ties in list order: struct.pack, np.lexsort and the\n"
"reordering in one call. Raises TypeError, ValueError or OverflowError,\n"
"writing nothing, otherwise.");

static PyObject *sort_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "sort_rows takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "sort_rows' rows must be a list of ints");
        return NULL;
    }
    PyObject *list = args[0];
    Py_ssize_t size = PyList_GET_SIZE(list);
    if (size % WIDTH) {
        PyErr_Format(PyExc_ValueError, "sort_rows' rows hold %zd ints, not whole rows of %d",
                     size, WIDTH);
        return NULL;
    }
    Py_buffer out;
    if (get_out(args[1], &out, 8, size, "sort_rows' out") < 0) return NULL;
    int64_t *table = out.buf;
    Py_ssize_t n = size / WIDTH;
    PyObject *answer = NULL;
    /* The keys (2 per row, sorted in place with as many for scratch), then
     * the list's ints as read, moved to the output in order. */
    Key *keys = PyMem_Malloc(n ? 2 * (size_t)n * sizeof(Key) : 1);
    Row *read = PyMem_Malloc(n ? (size_t)n * sizeof(Row) : 1);
    if (keys == NULL || read == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *ints = &read[0].v[0];
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        long long v;
        if (PyLong_CheckExact(item)) {
            v = PyLong_AsLongLong(item);
        } else {
            /* Through its __index__ (as struct.pack's), which runs Python
             * code: the list is re-measured after it. */
            Py_INCREF(item);
            v = PyLong_AsLongLong(item);
            Py_DECREF(item);
            if (PyList_GET_SIZE(list) != size) {
                PyErr_SetString(PyExc_RuntimeError, "sort_rows' rows changed while read");
                goto done;
            }
        }
        if (v == -1 && PyErr_Occurred()) goto done;
        ints[i] = (int64_t)v;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        keys[r].request = read[r].v[REQUEST];
        keys[r].index = read[r].v[INDEX];
        keys[r].pos = r;
    }
    Key *sorted = merge_sort(keys, keys + n, n);
    Row *rows = (Row *)table;
    for (Py_ssize_t r = 0; r < n; r++) rows[r] = read[sorted[r].pos];
    answer = Py_NewRef(Py_None);

done:
    PyMem_Free(read);
    PyMem_Free(keys);
    PyBuffer_Release(&out);
    return answer;
}

/* Checks every row of `table` (n rows) against a ring of `capacity` rows and
 * `n_slots` slots, and its last step type if `lasts`; sets *total to their
 * steps. -1 with ValueError naming the first bad row and `name`. */
static int check_rows(const int64_t *table, Py_ssize_t n, Py_ssize_t capacity, Py_ssize_t n_slots,
                      int lasts, const char *name, Py_ssize_t *total) {
    Py_ssize_t steps = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        const int64_t *row = table + r * WIDTH;
        if (row[LENGTH] < 1 || row[LENGTH] > capacity || row[START] < 0 || row[SLOT] < 0 ||
            row[SLOT] >= n_slots || (lasts && (row[LAST] < 0 || row[LAST] > 255))) {
            PyErr_Format(PyExc_ValueError,
                         "%s: row %zd (start %lld, length %lld, slot %lld, last %lld) "
                         "is outside a ring of %zd rows and %zd slots",
                         name, r, (long long)row[START], (long long)row[LENGTH],
                         (long long)row[SLOT], (long long)row[LAST], capacity, n_slots);
            return -1;
        }
        steps += (Py_ssize_t)row[LENGTH];  /* <= n * capacity: no overflow of a buffer's size */
    }
    *total = steps;
    return 0;
}

/* Reads `obj` as a FinishedTable (C-contiguous int64, whole rows of WIDTH):
 * *table its rows, *n how many. -1 with the error set (ValueError naming
 * `name`) and nothing held; else the caller releases `view`. */
static int get_table(PyObject *obj, Py_buffer *view, const char *name, const int64_t **table,
                     Py_ssize_t *n) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->itemsize != 8 || view->len % (WIDTH * 8)) {
        PyErr_Format(PyExc_ValueError, "%s' table must be int64 rows of %d", name, WIDTH);
        PyBuffer_Release(view);
        return -1;
    }
    *table = view->buf;
    *n = view->len / (WIDTH * 8);
    return 0;
}

PyDoc_STRVAR(step_index_doc,
"step_index(table, capacity, n_slots, index_out, types_out, last_out) -> None\n"
"\n"
"For the FinishedTable rows `table` (a C-contiguous int64 buffer, 10 ints a\n"
"row, in the episodes' order) of a ring of `capacity` rows and `n_slots`\n"
"slots: writes every step's flat ring index (split_rows) into index_out\n"
"(int64, the lengths' sum), its step type (step_types_of) into types_out\n"
"(uint8, as many) and each episode's last observation's flat index into\n"
"last_out (int64, one per row). Raises ValueError or TypeError, writing\n"
"nothing, if a row is out of range or an output does not fit.");

static PyObject *step_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "step_index takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t capacity = PyLong_AsSsize_t(args[1]);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n_slots = PyLong_AsSsize_t(args[2]);
    if (n_slots == -1 && PyErr_Occurred()) return NULL;
    if (capacity < 1 || n_slots < 1 || capacity > PY_SSIZE_T_MAX / n_slots) {
        PyErr_Format(PyExc_ValueError, "step_index: a ring of %zd rows and %zd slots", capacity,
                     n_slots);
        return NULL;
    }
    Py_buffer in;
    const int64_t *table;
    Py_ssize_t n;
    if (get_table(args[0], &in, "step_index", &table, &n) < 0) return NULL;
    PyObject *answer = NULL;
    Py_buffer index_view = {0}, types_view = {0}, last_view = {0};
    /* Every row checked and the steps counted before anything is written. */
    Py_ssize_t total;
    if (check_rows(table, n, capacity, n_slots, 1, "step_index", &total) < 0) goto done;
    if (get_out(args[3], &index_view, 8, total, "step_index' index_out") < 0) goto done;
    if (get_out(args[4], &types_view, 1, total, "step_index' types_out") < 0) goto done;
    if (get_out(args[5], &last_view, 8, n, "step_index' last_out") < 0) goto done;
    int64_t *index = index_view.buf, *last = last_view.buf;
    uint8_t *types = types_view.buf;
    Py_ssize_t k = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        const int64_t *row = table + r * WIDTH;
        Py_ssize_t length = (Py_ssize_t)row[LENGTH];
        int64_t base = row[SLOT] * (int64_t)capacity;
        int64_t first = row[START] % capacity;
        /* The rows past the ring's end wrap: first + length - 1 < 2 * capacity. */
        int64_t unwrapped = capacity - first < length ? capacity - first : length;
        int64_t at = base + first;
        int64_t *to = index + k;
        Py_ssize_t j = 0;
        /* Four at a time: the loop's own instructions were most of it. */
        for (; j + 4 <= unwrapped; j += 4) {
            to[j] = at + j;
            to[j + 1] = at + j + 1;
            to[j + 2] = at + j + 2;
            to[j + 3] = at + j + 3;
        }
        for (; j < unwrapped; j++) to[j] = at + j;
        for (at = base - unwrapped; j < length; j++) to[j] = at + j;
        types[k] = FIRST;
        memset(types + k + 1, MID, (size_t)(length - 1));
        types[k + length - 1] = (uint8_t)row[LAST];
        last[r] = base + (row[START] + length) % capacity;
        k += length;
    }
    answer = Py_NewRef(Py_None);

done:
    if (last_view.obj) PyBuffer_Release(&last_view);
    if (types_view.obj) PyBuffer_Release(&types_view);
    if (index_view.obj) PyBuffer_Release(&index_view);
    PyBuffer_Release(&in);
    return answer;
}

PyDoc_STRVAR(gather_runs_doc,
"gather_runs(table, capacity, source, out, offset) -> None\n"
"\n"
"Writes the rows of `source` (a ring column seen slot by slot, a\n"
"C-contiguous buffer of n_slots * capacity rows) of every step of the\n"
"FinishedTable rows `table`, in order, into `out` (a writable byte buffer)\n"
"from `offset`: the bytes of source.take(index, axis=0) for step_index's\n"
"index, each episode's rows copied as one run (two where they wrap around\n"
"the ring's end). Raises ValueError or TypeError, writing nothing, if a\n"
"row is out of range or the rows do not fit in `out`.");

static PyObject *gather_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "gather_runs takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t capacity = PyLong_AsSsize_t(args[1]);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[4]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    Py_buffer in, source, out;
    const int64_t *table;
    Py_ssize_t n, total;
    if (get_table(args[0], &in, "gather_runs", &table, &n) < 0) return NULL;
    if (PyObject_GetBuffer(args[2], &source, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    if (PyObject_GetBuffer(args[3], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&source);
        PyBuffer_Release(&in);
        return NULL;
    }
    PyObject *answer = NULL;
    Py_ssize_t source_rows = source.ndim >= 1 ? source.shape[0] : 0;
    if (capacity < 1 || source_rows < capacity || source_rows % capacity) {
        PyErr_Format(PyExc_ValueError, "gather_runs: a source of %zd rows is no ring of %zd rows",
                     source_rows, capacity);
        goto done;
    }
    Py_ssize_t n_slots = source_rows / capacity, row_bytes = source.len / source_rows;
    if (check_rows(table, n, capacity, n_slots, 0, "gather_runs", &total) < 0) goto done;
    /* total <= n * capacity rows; their bytes checked without overflow. */
    if (offset < 0 || offset > out.len || (row_bytes && total > (out.len - offset) / row_bytes)) {
        PyErr_Format(PyExc_ValueError,
                     "gather_runs: %zd rows of %zd bytes from offset %zd do not fit in %zd bytes",
                     total, row_bytes, offset, out.len);
        goto done;
    }
    char *to = (char *)out.buf + offset;
    const char *from = source.buf;
    for (Py_ssize_t r = 0; r < n; r++) {
        const int64_t *row = table + r * WIDTH;
        Py_ssize_t length = (Py_ssize_t)row[LENGTH];
        Py_ssize_t first = (Py_ssize_t)(row[START] % capacity);
        const char *slot = from + (Py_ssize_t)row[SLOT] * capacity * row_bytes;
        Py_ssize_t head = capacity - first < length ? capacity - first : length;
        memcpy(to, slot + first * row_bytes, (size_t)(head * row_bytes));
        to += head * row_bytes;
        if (head < length) {  /* the rest wraps to the ring's first rows */
            memcpy(to, slot, (size_t)((length - head) * row_bytes));
            to += (length - head) * row_bytes;
        }
    }
    answer = Py_NewRef(Py_None);

done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&source);
    PyBuffer_Release(&in);
    return answer;
}

static PyMethodDef module_methods[] = {
    {"sort_rows", (PyCFunction)(void (*)(void))sort_rows, METH_FASTCALL, sort_rows_doc},
    {"step_index", (PyCFunction)(void (*)(void))step_index, METH_FASTCALL, step_index_doc},
    {"gather_runs", (PyCFunction)(void (*)(void))gather_runs, METH_FASTCALL, gather_runs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_finished_pass",
    .m_doc = "A native worker's finished episodes taken in one pass over their rows and one "
             "over their steps (rlfleet.worker._native_columns).",
    .m_size = 0,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__finished_pass(void) { return PyModuleDef_Init(&module_def); }
