/* A learner's one-chunk result taken in read_frame_made's call
 * (rlfleet/wire/_result_reader.c includes this after its Result, fields_dict
 * and empty_args, which it uses).
 *
 * taken() makes the ViewedResult that ResultAssembler.whole and
 * ResultLayoutViews.view would make of a frame's result, from the header and
 * chunk the reader made and the answer's context; wherever they would not, or
 * anything fails on the way, it returns NULL with no error set and the
 * Python path reads the header and chunk again (tests/test_learner_frame_take.py).
 * It reads no frame bytes itself: the reader checked them, and view_check
 * checks the arrays' bytes against the frame's length.
 */
#ifndef RLFLEET_RESULT_TAKE_H
#define RLFLEET_RESULT_TAKE_H

/* The context read_frame_made takes a frame's result with, one tuple per
 * answer (rlfleet.client._responses.ResponseReader.frame_context). */
enum {
    TAKE_CALL, TAKE_VIEWED_TYPE, TAKE_KIND, TAKE_MAX_BYTES, TAKE_PARTIAL, TAKE_VIEWS,
    TAKE_LAYOUTS, TAKE_SPEC, TAKE_CHECK, TAKE_ASSEMBLER, TAKE_ITEMS
};
/* Attribute names and a result's fixed values (made when the module loads). */
static PyObject *taken_with_name, *checked_with_name, *seen_name, *viewed_name, *last_key_name,
    *dict_name, *zero, *one, *zero_float;
static const char *const VIEWED_NAMES[] = {"header", "chunks", "message_sizes", "seq", "at",
                                           "frame"};
#define VIEWED_FIELDS ((int)(sizeof VIEWED_NAMES / sizeof *VIEWED_NAMES))
static PyObject *viewed_keys[VIEWED_FIELDS];

/* (item,), taking item's reference (NULL with an error set if item is NULL). */
static PyObject *one_int(PyObject *item) {
    PyObject *out = item == NULL ? NULL : PyTuple_New(1);
    if (out == NULL) {
        Py_XDECREF(item);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, item);
    return out;
}

/* (episodes, steps), a plan's key (NULL with an error set). */
static PyObject *counts_key(Py_ssize_t episodes, long long steps) {
    PyObject *items[2] = {PyLong_FromSsize_t(episodes), PyLong_FromLongLong(steps)};
    PyObject *out = items[0] == NULL || items[1] == NULL ? NULL : PyTuple_New(2);
    if (out == NULL) {
        Py_XDECREF(items[0]);
        Py_XDECREF(items[1]);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, items[0]);
    PyTuple_SET_ITEM(out, 1, items[1]);
    return out;
}

/* The number of episodes and steps of lengths (a tuple of ints) into *episodes and
 * *steps: 0, or -1 where the views take no result of them (none, one below 1, a
 * sum past 64 bits) or with an error set. */
static int counts_of(PyObject *lengths, Py_ssize_t *episodes, long long *steps) {
    if (!PyTuple_CheckExact(lengths) || PyTuple_GET_SIZE(lengths) == 0) return -1;
    long long sum = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lengths); i++) {
        long long length = PyLong_AsLongLong(PyTuple_GET_ITEM(lengths, i));
        if (length < 1 || __builtin_add_overflow(sum, length, &sum)) return -1;
    }
    *episodes = PyTuple_GET_SIZE(lengths);
    *steps = sum;
    return 0;
}

/* The result ResultLayoutViews.view makes of a one-chunk frame its worker's kept
 * plan views, its step types checked in C (a ViewedResult, the assembler and the
 * views updated as ResultAssembler.whole and view update them): a new
 * reference, or NULL (no error set) wherever the Python path must read it;
 * ctx: TAKE_ITEMS items, header the result's (its worker and lengths those
 * given), data its chunk's. Nothing is changed before the result is sure but
 * what the Python path sets the same (the plan's seen). */
static PyObject *taken(PyObject *ctx, const Result *r, uint64_t call, PyObject *header,
                       PyObject *chunk, PyObject *worker, PyObject *lengths, PyObject *data) {
    PyObject *const *c = &PyTuple_GET_ITEM(ctx, 0);
    PyObject *kept = NULL, *with = NULL, *key = NULL, *plan = NULL, *check = NULL, *out = NULL;
    uint64_t count = r->chunk[2], total_bytes = r->chunk[3], kind = r->chunk[4];
    Py_ssize_t episodes;
    long long steps;
    /* ResultAssembler.whole: one chunk, whole, within the limit, no result of its
     * worker in progress. */
    if (PyLong_AsUnsignedLongLong(c[TAKE_CALL]) != call || count != 1 ||
        PyLong_AsUnsignedLongLong(c[TAKE_KIND]) != kind ||
        (uint64_t)(r->data_end - r->data_start) != total_bytes ||
        (c[TAKE_MAX_BYTES] != Py_None &&
         (long long)total_bytes > PyLong_AsLongLong(c[TAKE_MAX_BYTES])) ||
        PyDict_Contains(c[TAKE_PARTIAL], worker) != 0)
        goto done;
    /* ResultLayoutViews.view: the worker's layout of this spec, counts of a kept plan. */
    kept = PyDict_GetItemWithError(c[TAKE_LAYOUTS], worker);
    if (kept == NULL) goto done;
    Py_INCREF(kept);
    /* (spec, plans, lengths_size, lengths_signed, checked_types) */
    if ((with = PyObject_GetAttr(kept, taken_with_name)) == NULL || !PyTuple_CheckExact(with) ||
        PyTuple_GET_SIZE(with) != 5 || PyTuple_GET_ITEM(with, 0) != c[TAKE_SPEC] ||
        !PyDict_Check(PyTuple_GET_ITEM(with, 1)) || counts_of(lengths, &episodes, &steps) < 0)
        goto done;
    if (!PyMemoryView_Check(data)) goto done;
    const Py_buffer *held = PyMemoryView_GET_BUFFER(data);
    if (!held->readonly || held->ndim != 1 || held->format == NULL ||
        strcmp(held->format, "B") != 0 || !PyBuffer_IsContiguous(held, 'C'))
        goto done;
    if ((key = counts_key(episodes, steps)) == NULL ||
        (plan = PyDict_GetItemWithError(PyTuple_GET_ITEM(with, 1), key)) == NULL)
        goto done;
    Py_INCREF(plan);
    /* (size, runs, joined, lengths_at, limits) */
    if (PyObject_SetAttr(plan, seen_name, Py_True) < 0 ||
        (check = PyObject_GetAttr(plan, checked_with_name)) == NULL ||
        !PyTuple_CheckExact(check) || PyTuple_GET_SIZE(check) != 5 ||
        PyLong_AsSsize_t(PyTuple_GET_ITEM(check, 0)) != held->len)
        goto done;
    /* view_check(whole, runs, joined, lengths_at, lengths_size, lengths_signed,
     * lengths, limits), as view calls it (borrowed: with and check hold them). */
    PyObject *args[8] = {
        data,
        PyTuple_GET_ITEM(check, 1),
        PyTuple_GET_ITEM(check, 2),
        PyTuple_GET_ITEM(check, 3),
        PyTuple_GET_ITEM(with, 2),
        PyTuple_GET_ITEM(with, 3),
        lengths,
        PyTuple_GET_ITEM(check, 4),
    };
    PyObject *passed = PyObject_Vectorcall(c[TAKE_CHECK], args, 8, NULL);
    int checked = passed == NULL ? -1 : PyObject_IsTrue(passed);
    Py_XDECREF(passed);
    if (checked != 1) goto done;
    /* Other step types: view checks them on the batch. */
    if (PyObject_IsTrue(PyTuple_GET_ITEM(with, 4)) != 1) goto done;
    PyObject *values[VIEWED_FIELDS] = {
        Py_NewRef(header),
        PyTuple_Pack(1, chunk),
        one_int(PyLong_FromSsize_t(held->len)),
        Py_NewRef(zero),
        Py_NewRef(zero_float),
        PyTuple_Pack(3, data, plan, kept),
    };
    PyObject *fields = fields_dict(_PyDict_NewPresized(VIEWED_FIELDS), viewed_keys, values,
                                   VIEWED_FIELDS);
    PyTypeObject *viewed_type = (PyTypeObject *)c[TAKE_VIEWED_TYPE];
    PyObject *viewed =
        fields == NULL ? NULL : PyBaseObject_Type.tp_new(viewed_type, empty_args, NULL);
    if (viewed != NULL && PyObject_GenericSetAttr(viewed, dict_name, fields) < 0) Py_CLEAR(viewed);
    Py_XDECREF(fields);
    if (viewed == NULL) goto done;
    /* What whole and view set once the result is theirs. */
    PyObject *was = PyObject_GetAttr(c[TAKE_VIEWS], viewed_name);
    PyObject *now = was == NULL ? NULL : PyNumber_Add(was, one);
    Py_XDECREF(was);
    if (now == NULL || PyObject_SetAttr(c[TAKE_VIEWS], viewed_name, now) < 0 ||
        PyObject_SetAttr(c[TAKE_ASSEMBLER], last_key_name, worker) < 0) {
        Py_XDECREF(now);
        Py_DECREF(viewed);
        goto done;
    }
    Py_DECREF(now);
    out = viewed;
done:
    /* Anything that went wrong is the Python path's to meet again and say. */
    if (out == NULL) PyErr_Clear();
    Py_XDECREF(check);
    Py_XDECREF(plan);
    Py_XDECREF(key);
    Py_XDECREF(with);
    Py_XDECREF(kept);
    return out;
}

/* The names and values taken() uses (made when the module loads): 0, or -1
 * with an error set. */
static int take_names(void) {
    struct {
        PyObject **name;
        const char *text;
    } names[] = {
        {&taken_with_name, "taken_with"}, {&checked_with_name, "checked_with"},
        {&seen_name, "seen"}, {&viewed_name, "viewed"}, {&last_key_name, "_last_key"},
        {&dict_name, "__dict__"},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        PyObject **name = names[i].name;
        if (*name == NULL && (*name = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    }
    if (intern_names(VIEWED_NAMES, viewed_keys, VIEWED_FIELDS) < 0) return -1;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL) return -1;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return -1;
    if (zero_float == NULL && (zero_float = PyFloat_FromDouble(0.0)) == NULL) return -1;
    return 0;
}

#endif
