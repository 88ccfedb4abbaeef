/* The MLP kernel's arithmetic on vectors: layers, activations, exp and log
 * (included by rlfleet/policies/_mlp_kernel.c, whose opening comment gives the
 * rules that keep every value the reference's, bit for bit). */
#ifndef RLFLEET_MLP_MATH_H
#define RLFLEET_MLP_MATH_H

#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float v4sf __attribute__((vector_size(16)));
typedef int32_t v4si __attribute__((vector_size(16)));

#define LANES 4

static inline v4sf splat(float f) { return (v4sf){f, f, f, f}; }
static inline v4sf load4(const float *p) { v4sf v; memcpy(&v, p, sizeof v); return v; }
static inline void store4(float *p, v4sf v) { memcpy(p, &v, sizeof v); }
/* mask ? a : b, lane by lane (a mask lane is all ones or all zeros). */
static inline v4sf select4(v4si mask, v4sf a, v4sf b) {
    return (v4sf)((mask & (v4si)a) | (~mask & (v4si)b));
}

/* ------------------------------------------------------------ activations */

enum { ACT_TANH, ACT_RELU, ACT_IDENTITY };

#define TANH_CLAMP 7.90531110763549805f
#define TANH_TINY 0.0004f

/* The reference's tanh32 on one vector: clamp, odd/even Horner polynomials,
 * divide. Defined for 4 lanes here, for 8 (on AVX2) below. */
#define DEFINE_TANH(name, vf, vi, sp, sel, attr)                                  \
    static inline attr vf name(vf a) {                                            \
        const vf clamp = sp(TANH_CLAMP), neg_clamp = sp(-TANH_CLAMP);             \
        vf x = sel(a > clamp, clamp, a);                                          \
        x = sel(x < neg_clamp, neg_clamp, x);                                     \
        vf x2 = x * x;                                                            \
        vf p = sp(-2.76076847742355e-16f);                                        \
        p = x2 * p; p = p + sp(2.00018790482477e-13f);                            \
        p = x2 * p; p = p + sp(-8.60467152213735e-11f);                           \
        p = x2 * p; p = p + sp(5.12229709037114e-08f);                            \
        p = x2 * p; p = p + sp(1.48572235717979e-05f);                            \
        p = x2 * p; p = p + sp(6.37261928875436e-04f);                            \
        p = x2 * p; p = p + sp(4.89352455891786e-03f);                            \
        p = x * p;                                                                \
        vf q = sp(1.19825839466702e-06f);                                         \
        q = x2 * q; q = q + sp(1.18534705686654e-04f);                            \
        q = x2 * q; q = q + sp(2.26843463243900e-03f);                            \
        q = x2 * q; q = q + sp(4.89352518554385e-03f);                            \
        vf r = p / q;                                                             \
        vf magnitude = (vf)((vi)a & 0x7fffffff);                                  \
        return sel(magnitude < sp(TANH_TINY), a, r);                              \
    }

DEFINE_TANH(tanh4, v4sf, v4si, splat, select4, )

/* 0 if x < 0 else x: NaN and -0.0 pass unchanged. */
static inline v4sf relu4(v4sf a) { return select4(a < splat(0.0f), splat(0.0f), a); }

/* Applies the activation to n values (n a multiple of 4). */
static void activate(int activation, float *v, Py_ssize_t n) {
    Py_ssize_t j;
    if (activation == ACT_TANH) {
        for (j = 0; j < n; j += LANES) store4(v + j, tanh4(load4(v + j)));
    } else if (activation == ACT_RELU) {
        for (j = 0; j < n; j += LANES) store4(v + j, relu4(load4(v + j)));
    }
}

/* ------------------------------------------------------------- exp and log */

#define EXP_HI 88.72283935546875f
#define EXP_LO -103.97208404541015625f

/* 2**n as a float32, n in [-126, 127]: exact. */
static inline float pow2f(int n) {
    uint32_t bits = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The reference's exp32: Cephes' expf, scaled by 2**n in two exact steps. */
static float exp32(float x) {
    if (x != x) return x;
    if (x > EXP_HI) return INFINITY;
    if (x < EXP_LO) return 0.0f;
    float t = x * 1.44269504088896341f;
    t = t + 0.5f;
    float fn = floorf(t);
    int n = (int)fn;
    float r = fn * 0.693359375f;
    r = x - r;
    float r2 = fn * -2.12194440e-4f;
    r = r - r2;
    float z = r * r;
    float y = 1.9875691500e-4f;
    y = y * r; y = y + 1.3981999507e-3f;
    y = y * r; y = y + 8.3334519073e-3f;
    y = y * r; y = y + 4.1665795894e-2f;
    y = y * r; y = y + 1.6666665459e-1f;
    y = y * r; y = y + 5.0000001201e-1f;
    y = y * z; y = y + r; y = y + 1.0f;
    int n1 = n >= 0 ? n / 2 : -((1 - n) / 2); /* floor(n / 2), as Python's n // 2 */
    int n2 = n - n1;
    y = y * pow2f(n1);
    return y * pow2f(n2);
}

#define LOG_SQRT_HALF 0.70710678118654752440
#define LN2_HI 6.93147180369123816490e-01
#define LN2_LO 1.90821492927058770002e-10

/* The reference's log64, for finite z >= 1: frexp, then 2 atanh(s) as a series in s**2. */
static double log64(double z) {
    int e;
    double m = frexp(z, &e);
    if (m < LOG_SQRT_HALF) {
        m = m * 2.0;
        e = e - 1;
    }
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double s2 = s * s;
    double p = 1.0 / 23;
    p = p * s2 + 1.0 / 21; /* two roundings each: contraction is off */
    p = p * s2 + 1.0 / 19;
    p = p * s2 + 1.0 / 17;
    p = p * s2 + 1.0 / 15;
    p = p * s2 + 1.0 / 13;
    p = p * s2 + 1.0 / 11;
    p = p * s2 + 1.0 / 9;
    p = p * s2 + 1.0 / 7;
    p = p * s2 + 1.0 / 5;
    p = p * s2 + 1.0 / 3;
    p = p * s2 + 1.0;
    double log_m = (2.0 * s) * p;
    double de = (double)e;
    return de * LN2_HI + (log_m + de * LN2_LO);
}

#define HALF_LOG_2PI 0.91893853320467274178

/* ----------------------------------------------------------------- layers */

typedef struct {
    Py_ssize_t in;      /* inputs K */
    Py_ssize_t out;     /* outputs H */
    Py_ssize_t padded;  /* H rounded up to whole vectors; the extra columns are 0 */
    const float *weight; /* K x padded, row-major */
    const float *bias;   /* padded */
} Layer;

/* Columns j .. j + lanes * vectors - 1 of a dense layer, one sum per column in
 * a vector lane: out[j] = ((0 + in[0] w[0, j]) + in[1] w[1, j] + ...) + b[j].
 * Inlined with a constant `vectors`, so the sums stay in registers. Defined
 * for 4 lanes here, for 8 (on AVX2) below. */
#define DEFINE_DENSE_COLUMNS(name, vf, lanes, sp, load, store, attr)                        \
    static inline __attribute__((always_inline)) attr void name(                            \
        const float *restrict in, const Layer *layer, float *restrict out, Py_ssize_t j,    \
        int vectors) {                                                                      \
        const Py_ssize_t k_in = layer->in, width = layer->padded;                           \
        vf sum[8];                                                                          \
        for (int v = 0; v < vectors; v++) sum[v] = sp(0.0f);                                \
        const float *w = layer->weight + j;                                                 \
        for (Py_ssize_t k = 0; k < k_in; k++, w += width) {                                 \
            vf x = sp(in[k]);                                                               \
            for (int v = 0; v < vectors; v++) sum[v] = sum[v] + x * load(w + (lanes) * v);  \
        }                                                                                   \
        for (int v = 0; v < vectors; v++)                                                   \
            store(out + j + (lanes) * v, sum[v] + load(layer->bias + j + (lanes) * v));     \
    }

DEFINE_DENSE_COLUMNS(dense_columns, v4sf, LANES, splat, load4, store4, )

/* Every padded column of a dense layer: blocks of 8, 4 or 1 vectors keep
 * independent sums in flight. */
static void dense(const float *restrict in, const Layer *layer, float *restrict out) {
    const Py_ssize_t width = layer->padded;
    Py_ssize_t j = 0;
    for (; j + 8 * LANES <= width; j += 8 * LANES) dense_columns(in, layer, out, j, 8);
    for (; j + 4 * LANES <= width; j += 4 * LANES) dense_columns(in, layer, out, j, 4);
    for (; j < width; j += LANES) dense_columns(in, layer, out, j, 1);
}

/* ------------------------------------------------- 8 lanes, on AVX2 CPUs */

#if (defined(__x86_64__) || defined(__i386__)) && !defined(RLFLEET_MLP_NARROW)
#define WIDE_LANES 1
#define WIDE __attribute__((target("avx2")))

typedef float v8sf __attribute__((vector_size(32)));
typedef int32_t v8si __attribute__((vector_size(32)));

/* Whether the CPU runs the 8-lane functions (set once, at import). */
static int wide_lanes;

static inline WIDE v8sf splat8(float f) { return (v8sf){f, f, f, f, f, f, f, f}; }
static inline WIDE v8sf load8(const float *p) { v8sf v; memcpy(&v, p, sizeof v); return v; }
static inline WIDE void store8(float *p, v8sf v) { memcpy(p, &v, sizeof v); }
static inline WIDE v8sf select8(v8si mask, v8sf a, v8sf b) {
    return (v8sf)((mask & (v8si)a) | (~mask & (v8si)b));
}

DEFINE_TANH(tanh8, v8sf, v8si, splat8, select8, WIDE)

static inline WIDE v8sf relu8(v8sf a) { return select8(a < splat8(0.0f), splat8(0.0f), a); }

/* activate() 8 lanes at a time; a last 4 values take the 4-lane functions. */
static WIDE void activate8(int activation, float *v, Py_ssize_t n) {
    Py_ssize_t j = 0;
    if (activation == ACT_TANH) {
        for (; j + 8 <= n; j += 8) store8(v + j, tanh8(load8(v + j)));
        for (; j < n; j += LANES) store4(v + j, tanh4(load4(v + j)));
    } else if (activation == ACT_RELU) {
        for (; j + 8 <= n; j += 8) store8(v + j, relu8(load8(v + j)));
        for (; j < n; j += LANES) store4(v + j, relu4(load4(v + j)));
    }
}

DEFINE_DENSE_COLUMNS(dense_columns8, v8sf, 8, splat8, load8, store8, WIDE)

/* dense() with 8 lanes; a last 4 columns (padded widths are whole 4-lane
 * vectors) take the 4-lane sums. */
static WIDE void dense8(const float *restrict in, const Layer *layer, float *restrict out) {
    const Py_ssize_t width = layer->padded;
    Py_ssize_t j = 0;
    for (; j + 64 <= width; j += 64) dense_columns8(in, layer, out, j, 8);
    for (; j + 32 <= width; j += 32) dense_columns8(in, layer, out, j, 4);
    for (; j + 8 <= width; j += 8) dense_columns8(in, layer, out, j, 1);
    for (; j < width; j += LANES) dense_columns(in, layer, out, j, 1);
}
#endif

#endif /* RLFLEET_MLP_MATH_H */
