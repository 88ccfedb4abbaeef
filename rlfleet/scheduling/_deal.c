/* A refill's units dealt to the refilled workers in one call
 * (rlfleet.scheduling._deal; used by rlfleet.scheduling.units).
 *
 * A refill gives first a unit to every idle env slot of every worker, then
 * each worker's room, a slice of its slots at a time, to each worker in
 * turn (units._owners). Worked out with numpy, that was a dozen calls per
 * refill (the grid of rounds, the owners, a stable argsort, a bincount and
 * a slice per worker) plus a sort and a seed call per worker; here the
 * units are walked once in the owners' order and written grouped by worker
 * into one column, and the caller derives their seeds in one call.
 *
 * The inputs are the scheduler's own (no network input): still, anything
 * out of the common case answers None and the caller takes the numpy path,
 * which raises what it raised before: columns of another type or layout, a
 * worker with no slot, a negative idle count or room, more units than the
 * workers take, or units not strictly ascending (each worker's then need a
 * sort). Every write is bounded by the output column's length, checked to
 * be the input's. No Python code runs while a buffer is held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* Whether a buffer is a 1-D int64 column. */
static int is_int64_column(const Py_buffer *view) {
    const char *f = view->format;
    if (view->ndim != 1 || view->itemsize != 8 || f == NULL) return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    return (f[0] == 'q' || f[0] == 'l') && f[1] == '\0';
}

/* The non-negative Py_ssize_t items of a list or tuple of exact ints, `n`
 * long, into values: 1; 0 (no error set) for anything else. */
static int sizes_of(PyObject *seq, Py_ssize_t n, Py_ssize_t *values) {
    PyObject **items;
    if (PyTuple_CheckExact(seq) && PyTuple_GET_SIZE(seq) == n) {
        items = &PyTuple_GET_ITEM(seq, 0);
    } else if (PyList_CheckExact(seq) && PyList_GET_SIZE(seq) == n) {
        items = PySequence_Fast_ITEMS(seq);
    } else {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_CheckExact(items[i])) return 0;
        Py_ssize_t v = PyLong_AsSsize_t(items[i]);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (v < 0) return 0;
        values[i] = v;
    }
    return 1;
}

/* Walks the first `n` owners (units._owners): `counts` (zeroed by the
 * caller) ends as each worker's units; with `taken` and `out`, also writes
 * each unit at its worker's cursor in `cursor`. `left` is scratch, one per
 * worker. Returns the units walked (less than n: the workers take fewer). */
static Py_ssize_t walk(Py_ssize_t workers, const Py_ssize_t *slots, const Py_ssize_t *idle,
                       const Py_ssize_t *room, Py_ssize_t *left, Py_ssize_t n,
                       Py_ssize_t *counts, const int64_t *taken, int64_t *out,
                       Py_ssize_t *cursor) {
    Py_ssize_t position = 0;
    for (Py_ssize_t i = 0; i < workers; i++) {
        Py_ssize_t take = idle[i] < n - position ? idle[i] : n - position;
        if (out != NULL) {
            memcpy(out + cursor[i], taken + position, (size_t)take * sizeof(int64_t));
            cursor[i] += take;
        }
        counts[i] += take;
        position += take;
        left[i] = room[i];
    }
    /* Each round gives worker i min(what is left of its room, its slots);
     * a round gives a unit at least until every room is dealt. */
    while (position < n) {
        Py_ssize_t dealt = 0;
        for (Py_ssize_t i = 0; i < workers && position < n; i++) {
            Py_ssize_t size = left[i] < slots[i] ? left[i] : slots[i];
            if (size > n - position) size = n - position;
            if (out != NULL) {
                memcpy(out + cursor[i], taken + position, (size_t)size * sizeof(int64_t));
                cursor[i] += size;
            }
            counts[i] += size;
            left[i] -= size;
            position += size;
            dealt += size;
        }
        if (!dealt) break;
    }
    return position;
}

PyDoc_STRVAR(deal_doc,
             "deal(taken, slots, idle, room, out, /)\n--\n\n"
             "Writes the refill's units `taken` (int64, strictly ascending) into `out`\n"
             "(int64, as long) grouped by worker, each worker's in the order dealt, and\n"
             "returns where each worker's end (a list of ints); None, writing nothing,\n"
             "where the numpy path is to deal them (see the module's comment).");

static PyObject *deal(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "deal takes 5 arguments");
        return NULL;
    }
    PyObject *seq = args[1];
    Py_ssize_t workers;
    if (PyTuple_CheckExact(seq)) {
        workers = PyTuple_GET_SIZE(seq);
    } else if (PyList_CheckExact(seq)) {
        workers = PyList_GET_SIZE(seq);
    } else {
        Py_RETURN_NONE;
    }
    if (workers < 1 || workers > PY_SSIZE_T_MAX / (6 * (Py_ssize_t)sizeof(Py_ssize_t))) {
        Py_RETURN_NONE;
    }
    Py_ssize_t *table = PyMem_Calloc((size_t)workers * 6, sizeof(Py_ssize_t));
    if (table == NULL) return PyErr_NoMemory();
    Py_ssize_t *slots = table, *idle = table + workers, *room = table + 2 * workers;
    Py_ssize_t *counts = table + 3 * workers, *cursor = table + 4 * workers;
    Py_ssize_t *left = table + 5 * workers;
    PyObject *answer = NULL;
    if (!sizes_of(args[1], workers, slots) || !sizes_of(args[2], workers, idle) ||
        !sizes_of(args[3], workers, room)) {
        PyMem_Free(table);
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < workers; i++) {
        if (slots[i] < 1) {
            PyMem_Free(table);
            Py_RETURN_NONE;
        }
    }
    Py_buffer taken, out;
    if (PyObject_GetBuffer(args[0], &taken, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyMem_Free(table);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(args[4], &out, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) <
        0) {
        PyErr_Clear();
        PyBuffer_Release(&taken);
        PyMem_Free(table);
        Py_RETURN_NONE;
    }
    const int64_t *units = taken.buf;
    Py_ssize_t n = is_int64_column(&taken) ? taken.len / 8 : -1;
    int common = n >= 0 && is_int64_column(&out) && out.len == taken.len &&
                 (out.buf == NULL || (const char *)out.buf + out.len <= (const char *)taken.buf ||
                  (const char *)taken.buf + taken.len <= (const char *)out.buf);
    for (Py_ssize_t p = 1; common && p < n; p++) common = units[p - 1] < units[p];
    if (common) common = walk(workers, slots, idle, room, left, n, counts, NULL, NULL, NULL) == n;
    if (common) {
        Py_ssize_t end = 0;
        for (Py_ssize_t i = 0; i < workers; i++) {
            cursor[i] = end;
            end += counts[i];
            counts[i] = 0;
        }
        walk(workers, slots, idle, room, left, n, counts, units, out.buf, cursor);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&taken);
    if (!common) {
        PyMem_Free(table);
        Py_RETURN_NONE;
    }
    answer = PyList_New(workers);
    for (Py_ssize_t i = 0; answer != NULL && i < workers; i++) {
        PyObject *end = PyLong_FromSsize_t(cursor[i]);
        if (end == NULL) Py_CLEAR(answer);
        else PyList_SET_ITEM(answer, i, end);
    }
    PyMem_Free(table);
    return answer;
}

static PyMethodDef module_methods[] = {
    {"deal", (PyCFunction)(void (*)(void))deal, METH_FASTCALL, deal_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_deal",
    .m_doc = "A refill's units dealt to the refilled workers in one call "
             "(rlfleet.scheduling.units).",
    .m_size = 0,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__deal(void) { return PyModuleDef_Init(&module_def); }
