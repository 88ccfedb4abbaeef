/* A task's units found, checked and booked for a worker's results in one call
 * (rlfleet.scheduling._unit_book; used by rlfleet.scheduling.task_units).
 *
 * A task keeps its units as a sorted int64 column of episode indices and a
 * bool column of those still outstanding (TaskUnits). Judging a result and
 * booking it took a dozen numpy calls on its few indices each (array from
 * the header's tuple, searchsorted, take, compare, count_nonzero...), most of
 * the scheduler's cost per result; here it is one call over the results'
 * tuples, with no array made.
 *
 * The indices and lengths come from a worker's result header (network
 * input, as Python ints): anything that is not a list or tuple of exact ints
 * fitting in int64, an empty result, a length count that is not the index
 * count, an index that is not a unit of the task, not outstanding, or named
 * twice makes `outstanding` answer False, changing nothing, and the caller
 * takes its general path (which says what is wrong). The columns are the
 * scheduler's own: checked to be 1-D, C-contiguous, of their types and to
 * hold `count` units; every position is found by a binary search bounded by
 * `count`, and `scatter` checks each slot against its column's length.
 * No Python code runs while a buffer is held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Positions of up to this many episodes are kept on the stack. */
#define STACK_POSITIONS 256

/* Whether a buffer is 1-D, of items of `size` bytes with one of `formats`. */
static int is_column(const Py_buffer *view, Py_ssize_t size, const char *formats) {
    const char *f = view->format;
    if (view->ndim != 1 || view->itemsize != size || f == NULL) return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    return f[0] != '\0' && f[1] == '\0' && strchr(formats, f[0]) != NULL;
}

/* A column of the scheduler's: int64 ("q"/"l") or bool ("?"). */
static int get_column(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t size,
                      const char *formats, const char *name) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (!is_column(view, size, formats)) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D C-contiguous %s array", name,
                     size == 8 ? "int64" : "bool");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The items of a list or tuple into *items (NULL if it is an empty list) and
 * *n: 1; 0 for anything else. */
static int items_of(PyObject *seq, PyObject ***items, Py_ssize_t *n) {
    if (PyTuple_CheckExact(seq)) {
        *n = PyTuple_GET_SIZE(seq);
        *items = &PyTuple_GET_ITEM(seq, 0);
        return 1;
    }
    if (PyList_CheckExact(seq)) {
        *n = PyList_GET_SIZE(seq);
        *items = PySequence_Fast_ITEMS(seq);
        return 1;
    }
    return 0;
}

/* An exact int in int64 into *value: 1; 0 (no error set) for anything else. */
static int int64_of(PyObject *item, int64_t *value) {
    if (!PyLong_CheckExact(item)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *value = (int64_t)v;
    return 1;
}

/* The first position in held[from:count] whose index is >= value, galloping
 * from `from`: a result's episodes are mostly ascending and near each other
 * in its task's units, so each is found a few steps past the one before
 * (where a search over the whole column touched its cache lines anew). */
static Py_ssize_t lower_bound(const int64_t *held, Py_ssize_t from, Py_ssize_t count,
                              int64_t value) {
    Py_ssize_t low = from, step = 1;
    while (low + step < count && held[low + step] < value) {
        low += step;
        step *= 2;
    }
    Py_ssize_t high = low + step < count ? low + step : count;
    while (low < high) {
        Py_ssize_t mid = low + (high - low) / 2;
        if (held[mid] < value)
            low = mid + 1;
        else
            high = mid;
    }
    return low;
}

static int compare_positions(const void *a, const void *b) {
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* Whether n positions name no unit twice (sorted in place if they are not ascending). */
static int none_twice(Py_ssize_t *positions, Py_ssize_t n) {
    int ascending = 1;
    for (Py_ssize_t k = 1; k < n && ascending; k++) ascending = positions[k] > positions[k - 1];
    if (ascending) return 1;
    qsort(positions, (size_t)n, sizeof(Py_ssize_t), compare_positions);
    for (Py_ssize_t k = 1; k < n; k++) {
        if (positions[k] == positions[k - 1]) return 0;
    }
    return 1;
}

/* Whether every index of every result is a unit of held[0:count] still out
 * (none twice), each result's lengths (if given) as many ints as its indices;
 * with mark, those units are then marked back. Positions go to *positions
 * (grown on the heap past the stack's). Returns 1, 0, or -1 with an error. */
static int find_all(const int64_t *held, char *out, Py_ssize_t count, PyObject *results,
                    PyObject *lengths, int mark, Py_ssize_t **positions, Py_ssize_t *room) {
    Py_ssize_t nresults = 0, nlengths = 0;
    PyObject **result = NULL, **length = NULL;
    if (!items_of(results, &result, &nresults) || nresults == 0) return 0;
    if (lengths != Py_None && (!items_of(lengths, &length, &nlengths) || nlengths != nresults))
        return 0;
    Py_ssize_t n = 0;
    for (Py_ssize_t r = 0; r < nresults; r++) {
        Py_ssize_t size = 0;
        PyObject **index = NULL;
        if (!items_of(result[r], &index, &size) || size == 0) return 0;
        if (length != NULL) {
            Py_ssize_t sizes = 0;
            PyObject **steps = NULL;
            if (!items_of(length[r], &steps, &sizes) || sizes != size) return 0;
            for (Py_ssize_t k = 0; k < size; k++) {
                int64_t value;
                if (!int64_of(steps[k], &value)) return 0;
            }
        }
        if (n + size > *room) {
            Py_ssize_t grown = 2 * (n + size);
            Py_ssize_t *bigger = PyMem_Malloc((size_t)grown * sizeof(Py_ssize_t));
            if (bigger == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            memcpy(bigger, *positions, (size_t)n * sizeof(Py_ssize_t));
            if (*room > STACK_POSITIONS) PyMem_Free(*positions);
            *positions = bigger;
            *room = grown;
        }
        for (Py_ssize_t k = 0; k < size; k++) {
            int64_t value;
            if (!int64_of(index[k], &value)) return 0;
            /* Past the last one found if this one follows it, else from the start. */
            Py_ssize_t from = 0;
            if (n > 0 && held[(*positions)[n - 1]] < value) from = (*positions)[n - 1] + 1;
            Py_ssize_t at = lower_bound(held, from, count, value);
            if (at >= count || held[at] != value || !out[at]) return 0;
            (*positions)[n++] = at;
        }
    }
    if (!none_twice(*positions, n)) return 0;
    if (mark) {
        for (Py_ssize_t k = 0; k < n; k++) out[(*positions)[k]] = 0;
    }
    return 1;
}

PyDoc_STRVAR(outstanding_doc,
"outstanding(held, out, count, results, lengths, mark, /)\n--\n\n"
"Whether the results' episodes are all units of a task still outstanding, none twice.\n\n"
"held: the task's episode indices, int64, ascending in held[0:count].\n"
"out: whether each is outstanding, bool (writable with mark).\n"
"count: the units held (at most either column's length).\n"
"results: a list or tuple of results' episode indices, each a list or tuple of ints.\n"
"lengths: None, or the results' lengths alike, as many per result as its indices.\n"
"mark: once all are found outstanding, mark them back (out set False).\n\n"
"Returns True if every result holds at least one episode, each an int64 index\n"
"of a unit in held[0:count] whose out is set, no unit named twice (and, with\n"
"lengths, every length an int64 int, as many as the indices); else False,\n"
"nothing changed. Raises TypeError or ValueError for columns not as above.");

static PyObject *outstanding(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "outstanding takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    int mark = PyObject_IsTrue(args[5]);
    if (mark < 0) return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    Py_buffer held, out;
    if (get_column(args[0], &held, 0, 8, "ql", "held") < 0) return NULL;
    if (get_column(args[1], &out, mark, 1, "?", "out") < 0) {
        PyBuffer_Release(&held);
        return NULL;
    }
    PyObject *answer = NULL;
    Py_ssize_t stack[STACK_POSITIONS];
    Py_ssize_t *positions = stack, room = STACK_POSITIONS;
    if (count < 0 || count > held.shape[0] || count > out.shape[0]) {
        PyErr_Format(PyExc_ValueError,
                     "outstanding's count %zd is outside its columns (%zd indices, %zd flags)",
                     count, held.shape[0], out.shape[0]);
        goto done;
    }
    int found = find_all(held.buf, out.buf, count, args[3], args[4], mark, &positions, &room);
    if (found >= 0) answer = Py_NewRef(found ? Py_True : Py_False);

done:
    if (positions != stack) PyMem_Free(positions);
    PyBuffer_Release(&out);
    PyBuffer_Release(&held);
    return answer;
}

PyDoc_STRVAR(scatter_doc,
"scatter(known, base, indices, lengths, /)\n--\n\n"
"Sets known[index - base] = length for each index and its length.\n\n"
"known: a writable int64 array.\n"
"indices, lengths: lists or tuples of ints, as many lengths as indices.\n"
"Raises ValueError, known unchanged, if a slot lies outside known or the\n"
"counts differ; TypeError or OverflowError for a value that is not an int64 int.");

static PyObject *scatter(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "scatter takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    long long base = PyLong_AsLongLong(args[1]);
    if (base == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = 0, nlengths = 0;
    PyObject **index = NULL, **length = NULL;
    if (!items_of(args[2], &index, &n) || !items_of(args[3], &length, &nlengths)) {
        PyErr_SetString(PyExc_TypeError, "scatter's indices and lengths must be lists or tuples");
        return NULL;
    }
    if (n != nlengths) {
        PyErr_Format(PyExc_ValueError, "scatter got %zd indices and %zd lengths", n, nlengths);
        return NULL;
    }
    Py_buffer known;
    if (get_column(args[0], &known, 1, 8, "ql", "known") < 0) return NULL;
    int64_t *slots = known.buf;
    Py_ssize_t size = known.shape[0];
    PyObject *answer = NULL;
    /* Every slot checked before any is written: known is left whole on an error. */
    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t k = 0; k < n; k++) {
            int64_t at, value;
            if (!int64_of(index[k], &at) || !int64_of(length[k], &value)) {
                PyErr_Format(PyExc_TypeError, "scatter's index and length %zd must be int64 ints",
                             k);
                goto done;
            }
            /* at - base without overflow: both compared as they are. */
            if ((base >= 0 && at < INT64_MIN + base) || (base < 0 && at > INT64_MAX + base) ||
                at - base < 0 || at - base >= size) {
                PyErr_Format(PyExc_ValueError,
                             "scatter's index %lld is outside known's %zd slots from %lld",
                             (long long)at, size, base);
                goto done;
            }
            if (pass == 1) slots[at - base] = value;
        }
    }
    answer = Py_NewRef(Py_None);

done:
    PyBuffer_Release(&known);
    return answer;
}

static PyMethodDef module_methods[] = {
    {"outstanding", (PyCFunction)(void (*)(void))outstanding, METH_FASTCALL, outstanding_doc},
    {"scatter", (PyCFunction)(void (*)(void))scatter, METH_FASTCALL, scatter_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_unit_book",
    .m_doc = "A task's units found, checked and booked for a worker's results in one call "
             "(rlfleet.scheduling.task_units).",
    .m_size = 0,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__unit_book(void) { return PyModuleDef_Init(&module_def); }
