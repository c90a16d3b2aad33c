/* One decode step's attention for the lean forward on a CPU (decode_kernel.py builds and loads it).

   Compiled per model shape: HEAD_DIM (a power of two, 8..256) and GROUP (query heads per
   key/value head). Rows b0..b1-1; row b holds pos[b] cached tokens. For each row and kv head it
   writes the new key and value at column pos[b], then attends its GROUP queries over columns
   0..pos[b] only (no padded columns, no mask). Keys are stored transposed, [D, cols] per
   (row, kv head), so the scores of CH columns are one vector per query; values are [cols, D].
   Softmax in fp32 with the running maximum subtracted; exp is a degree-7 polynomial after an
   exact ln2 range reduction (relative error < 2e-7). Written with GCC/Clang vector extensions,
   so it vectorizes on any target the compiler knows. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef GROUP
#error "GROUP must be defined"
#endif
#define D HEAD_DIM
#define G GROUP
#if defined(__AVX512F__)
#define CH 16 /* columns per score vector: the target's vector width, so no op is split */
#elif defined(__AVX__)
#define CH 8
#else
#define CH 4
#endif
/* The value sum keeps G * D floats of accumulators: in VU independent sets over columns (to
   hide the add latency) while they fit the registers, else tiled over D, CH floats at a time. */
#define TILE_D (G * D > 16 * CH && D % CH == 0)
#define VU (G * D <= 8 * CH ? 4 : G * D <= 16 * CH ? 2 : 1)

typedef float vc __attribute__((vector_size(CH * 4)));
typedef int32_t vci __attribute__((vector_size(CH * 4)));
typedef float vd __attribute__((vector_size(D * 4)));

#define INLINE static inline __attribute__((always_inline))

INLINE vc load_c(const float *p) { vc x; memcpy(&x, p, sizeof x); return x; }
INLINE vd load_d(const float *p) { vd x; memcpy(&x, p, sizeof x); return x; }
INLINE vc sel(vci m, vc a, vc b) { return (vc)(((vci)a & m) | ((vci)b & ~m)); }
INLINE vc vmax(vc a, vc b) { return sel(a > b, a, b); }

/* e^x for x <= 0 (clamped at -87, where it is below 2^-125) */
INLINE vc exp_neg(vc x) {
    x = vmax(x, (vc){} - 87.0f);
    const vc shifter = (vc){} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    vc k = (x * 1.44269504088896341f + shifter) - shifter;
    vc r = x - k * 0.693145751953125f; /* ln2 split in two: the first part is exact in fp32 */
    r = r - k * 1.428606765330187045e-06f;
    vc p = (vc){} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vci e = (__builtin_convertvector(k, vci) + 127) << 23;
    return p * (vc)e;
}

/* The score vector's width in floats (the target's SIMD width): below 8 the kernel is slower
   than sdpa (measured with SSE2 only), and decode_kernel.py does not use it. */
int decode_attention_lanes(void) { return CH; }

/* q: row b's query head (h * G + g) at q + b * q_row + (h * G + g) * D.
   k_new / v_new: row b's kv head h at k_new + b * k_row + h * D (likewise v).
   kt: row b's kv head h keys at kt + b * cache_row + h * cache_head, key w's element d at d * cols + w.
   v: the same rows and heads, value w at w * D.
   out: [rows, kv_heads * G * D], row b's query head (h * G + g) at out + (b * kv_heads * G + h * G + g) * D.
   Returns 0, or -1 if scratch memory could not be allocated. */
int decode_attention(const float *q, int64_t q_row, const float *k_new, int64_t k_row, const float *v_new,
                     int64_t v_row, float *kt, float *v, int64_t cache_row, int64_t cache_head, int64_t cols,
                     const int64_t *pos, int64_t b0, int64_t b1, int64_t kv_heads, float scale, float *out) {
    int64_t widest = 0;
    for (int64_t b = b0; b < b1; b++) widest = pos[b] + 1 > widest ? pos[b] + 1 : widest;
    /* s[c * G + g]: chunk c of query g's scores, vector-aligned */
    vc *s = aligned_alloc(sizeof(vc), sizeof(vc) * G * ((widest + CH - 1) / CH));
    if (s == NULL) return -1;
    const float *sf = (const float *)s;
    vci iota;
    for (int j = 0; j < CH; j++) iota[j] = j;
    const float neg_inf = -__builtin_inff();
    for (int64_t b = b0; b < b1; b++) {
        const int64_t at = pos[b], n = at + 1, chunks = (n + CH - 1) / CH;
        for (int64_t h = 0; h < kv_heads; h++) {
            float *kp = kt + b * cache_row + h * cache_head;
            float *vp = v + b * cache_row + h * cache_head;
            const float *kn = k_new + b * k_row + h * D, *vn = v_new + b * v_row + h * D;
            for (int d = 0; d < D; d++) kp[d * cols + at] = kn[d];
            memcpy(vp + at * D, vn, sizeof(float) * D);
            const float *qp = q + b * q_row + h * G * D;

            vc mx[G];
            for (int g = 0; g < G; g++) mx[g] = (vc){} + neg_inf;
            for (int64_t c = 0; c < chunks; c++) {
                const int64_t w0 = c * CH;
                vc a[G];
                for (int g = 0; g < G; g++) a[g] = (vc){};
                if (w0 + CH <= cols) {
                    for (int d = 0; d < D; d++) {
                        const vc kd = load_c(kp + d * cols + w0);
                        for (int g = 0; g < G; g++) a[g] += qp[g * D + d] * kd;
                    }
                } else { /* the buffer's last columns: copy what exists */
                    float tmp[CH] = {0};
                    for (int d = 0; d < D; d++) {
                        for (int64_t j = 0; j < cols - w0; j++) tmp[j] = kp[d * cols + w0 + j];
                        const vc kd = load_c(tmp);
                        for (int g = 0; g < G; g++) a[g] += qp[g * D + d] * kd;
                    }
                }
                const vci live = iota < (int32_t)(n - w0); /* -1 on the row's columns, 0 past them */
                for (int g = 0; g < G; g++) {
                    const vc x = sel(live, a[g] * scale, (vc){} + neg_inf);
                    s[c * G + g] = x;
                    mx[g] = vmax(x, mx[g]);
                }
            }
            float inv[G];
            for (int g = 0; g < G; g++) {
                float m = mx[g][0];
                for (int j = 1; j < CH; j++) m = mx[g][j] > m ? mx[g][j] : m;
                vc tot = (vc){};
                for (int64_t c = 0; c < chunks; c++) {
                    const vc x = s[c * G + g];
                    const vc e = sel(x == neg_inf, (vc){}, exp_neg(x - m));
                    s[c * G + g] = e;
                    tot += e;
                }
                float t = 0.f;
                for (int j = 0; j < CH; j++) t += tot[j];
                inv[g] = 1.0f / t;
            }

            float *op = out + (b * kv_heads + h) * G * D;
#if TILE_D
            /* G * D is too many accumulators for the registers: one CH-wide slice of D at a time */
            for (int t = 0; t < D; t += CH) {
                vc acc[G];
                for (int g = 0; g < G; g++) acc[g] = (vc){};
                for (int64_t w = 0; w < n; w++) {
                    const vc vw = load_c(vp + w * D + t);
                    const int64_t c = w / CH, j = w % CH;
                    for (int g = 0; g < G; g++) acc[g] += sf[(c * G + g) * CH + j] * vw;
                }
                for (int g = 0; g < G; g++) {
                    const vc r = acc[g] * inv[g];
                    memcpy(op + g * D + t, &r, sizeof r);
                }
            }
#else
            vd acc[G][VU];
            for (int g = 0; g < G; g++)
                for (int u = 0; u < VU; u++) acc[g][u] = (vd){};
            int64_t w = 0;
            for (; w + VU <= n; w += VU)
                for (int u = 0; u < VU; u++) {
                    const vd vw = load_d(vp + (w + u) * D);
                    const int64_t c = (w + u) / CH, j = (w + u) % CH;
                    for (int g = 0; g < G; g++) acc[g][u] += sf[(c * G + g) * CH + j] * vw;
                }
            for (; w < n; w++) {
                const vd vw = load_d(vp + w * D);
                const int64_t c = w / CH, j = w % CH;
                for (int g = 0; g < G; g++) acc[g][0] += sf[(c * G + g) * CH + j] * vw;
            }
            for (int g = 0; g < G; g++) {
                vd r = acc[g][0];
                for (int u = 1; u < VU; u++) r += acc[g][u];
                r *= inv[g];
                memcpy(op + g * D, &r, sizeof r);
            }
#endif
        }
    }
    free(s);
    return 0;
}
