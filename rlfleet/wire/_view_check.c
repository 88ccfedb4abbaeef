/* A learner's checks of a result viewed at a kept plan, in one call (rlfleet.wire._view_check).
 *
 * rlfleet.wire.result_views views a result of counts seen before at the
 * offsets of its worker's kept plan, after the checks decoding makes: the
 * bytes between the arrays are the plan's, the lengths the header's, uint8
 * step types in StepType's range and bools 0 or 1. In numpy and bytes
 * methods these cost about 13,000 instructions for a 400-step CartPole
 * result (a take and a comparison of the bytes between, a list of the
 * lengths, a translate of the step types); here they are one pass over the
 * bytes they concern.
 *
 * The frame is network input and the plan's offsets come from counts read
 * off it: every run and range is checked to lie inside the frame (sizes
 * compared without adding to offsets, so no overflow) before a byte of it is
 * read, and anything that does not fit is a mismatch (False), never a read
 * outside. The buffers are held only for the call and released on every path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* Whether [offset, offset + size) lies inside a buffer of len bytes. */
static int inside(int64_t offset, int64_t size, Py_ssize_t len) {
    return offset >= 0 && size >= 0 && offset <= (int64_t)len && size <= (int64_t)len - offset;
}

/* Whether the frame's runs (int64 (offset, bytes) pairs) are, one after the
 * other, exactly ``joined``. */
static int runs_match(const Py_buffer *frame, const Py_buffer *runs, const Py_buffer *joined) {
    const unsigned char *bytes = frame->buf;
    const unsigned char *expected = joined->buf;
    Py_ssize_t n = runs->len / 16, at = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t pair[2];
        memcpy(pair, (const char *)runs->buf + 16 * k, sizeof pair);
        if (!inside(pair[0], pair[1], frame->len) || !inside(at, pair[1], joined->len)) return 0;
        if (memcmp(bytes + pair[0], expected + at, (size_t)pair[1]) != 0) return 0;
        at += (Py_ssize_t)pair[1];
    }
    return at == joined->len;
}

/* Whether every byte of each range (int64 (offset, bytes, largest value)
 * triples) is at most its largest value. */
static int ranges_hold(const Py_buffer *frame, const Py_buffer *limits) {
    const unsigned char *bytes = frame->buf;
    Py_ssize_t n = limits->len / 24;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t triple[3];
        memcpy(triple, (const char *)limits->buf + 24 * k, sizeof triple);
        if (!inside(triple[0], triple[1], frame->len)) return 0;
        const unsigned char *from = bytes + triple[0];
        if (triple[2] < 0) return 0;
        unsigned char most = triple[2] > 255 ? 255 : (unsigned char)triple[2];
        unsigned char seen = 0;
        for (int64_t i = 0; i < triple[1]; i++) seen |= (unsigned char)(from[i] > most);
        if (seen) return 0;
    }
    return 1;
}

/* The integer of ``size`` bytes (1, 2, 4 or 8) at ``from``, in this machine's
 * order; 0 in *fits when it is an unsigned one past int64's range. */
static int64_t read_int(const unsigned char *from, int size, int is_signed, int *fits) {
    *fits = 1;
    switch (size) {
    case 1:
        return is_signed ? (int64_t)(int8_t)from[0] : (int64_t)from[0];
    case 2: {
        uint16_t v;
        memcpy(&v, from, 2);
        return is_signed ? (int64_t)(int16_t)v : (int64_t)v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, from, 4);
        return is_signed ? (int64_t)(int32_t)v : (int64_t)v;
    }
    default: {
        uint64_t v;
        memcpy(&v, from, 8);
        if (!is_signed && v > (uint64_t)INT64_MAX) *fits = 0;
        return (int64_t)v;
    }
    }
}

/* 1 if the frame's ``count`` integers at ``at`` are ``lengths``' values, 0 if
 * not, -1 with an exception set if a length is not an int. */
static int lengths_match(const Py_buffer *frame, Py_ssize_t at, int size, int is_signed,
                         PyObject *lengths) {
    PyObject *listed = PySequence_Fast(lengths, "view_check's lengths must be a list or tuple");
    if (listed == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(listed);
    PyObject **items = PySequence_Fast_ITEMS(listed);
    int result = 1;
    if (at < 0 || at > frame->len || n > (frame->len - at) / size) {
        result = 0;
        goto done;
    }
    const unsigned char *from = (const unsigned char *)frame->buf + at;
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow = 0, fits;
        long long want = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (want == -1 && PyErr_Occurred()) {
            result = -1;
            goto done;
        }
        int64_t got = read_int(from + (Py_ssize_t)size * i, size, is_signed, &fits);
        if (overflow || !fits || got != (int64_t)want) {
            result = 0;
            goto done;
        }
    }
done:
    Py_DECREF(listed);
    return result;
}

PyDoc_STRVAR(view_check_doc,
"view_check(frame, runs, joined, lengths_at, lengths_size, lengths_signed, lengths, limits, /)\n"
"--\n\n"
"Whether a result's frame passes the checks of viewing it at a kept plan.\n\n"
"frame: the result's bytes (a contiguous buffer).\n"
"runs: int64 (byte offset, byte count) pairs, 16 bytes a run: the runs of\n"
"bytes between the arrays, whose bytes one after the other must be ``joined``.\n"
"lengths_at, lengths_size, lengths_signed: where the lengths are and their\n"
"integers' size (1, 2, 4 or 8, this machine's byte order) and signedness.\n"
"lengths: the header's lengths (ints), which the frame's must be.\n"
"limits: int64 (byte offset, byte count, largest value) triples, 24 bytes a\n"
"range: each byte of each range must be at most its largest value.\n\n"
"Returns True if all hold; False if any does not, or a run or range lies\n"
"outside the frame (nothing outside it is read).\n"
"Raises TypeError or ValueError if an argument is not of its kind.");

static PyObject *view_check(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "view_check takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t lengths_at = PyLong_AsSsize_t(args[3]);
    if (lengths_at == -1 && PyErr_Occurred()) return NULL;
    long size = PyLong_AsLong(args[4]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (size != 1 && size != 2 && size != 4 && size != 8) {
        PyErr_Format(PyExc_ValueError, "view_check's lengths_size must be 1, 2, 4 or 8, not %ld",
                     size);
        return NULL;
    }
    int is_signed = PyObject_IsTrue(args[5]);
    if (is_signed < 0) return NULL;

    Py_buffer frame, runs, joined, limits;
    int have_frame = 0, have_runs = 0, have_joined = 0, have_limits = 0;
    PyObject *out = NULL;
    if (PyObject_GetBuffer(args[0], &frame, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_frame = 1;
    if (PyObject_GetBuffer(args[1], &runs, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_runs = 1;
    if (PyObject_GetBuffer(args[2], &joined, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_joined = 1;
    if (PyObject_GetBuffer(args[7], &limits, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_limits = 1;
    if (runs.len % 16 != 0 || limits.len % 24 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "view_check's runs must be int64 pairs and its limits int64 triples "
                     "(%zd and %zd bytes given)",
                     runs.len, limits.len);
        goto done;
    }
    int matches = lengths_match(&frame, lengths_at, (int)size, is_signed, args[6]);
    if (matches < 0) goto done;
    matches = matches && runs_match(&frame, &runs, &joined) && ranges_hold(&frame, &limits);
    out = PyBool_FromLong(matches);
done:
    if (have_limits) PyBuffer_Release(&limits);
    if (have_joined) PyBuffer_Release(&joined);
    if (have_runs) PyBuffer_Release(&runs);
    if (have_frame) PyBuffer_Release(&frame);
    return out;
}

static PyMethodDef module_methods[] = {
    {"view_check", (PyCFunction)(void (*)(void))view_check, METH_FASTCALL, view_check_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot module_slots[] = {{0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_view_check",
    .m_doc = "A learner's checks of a result viewed at a kept plan, in one call "
             "(rlfleet.wire.result_views).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__view_check(void) { return PyModuleDef_Init(&module_def); }
