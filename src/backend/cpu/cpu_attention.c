/* cpu_attention: causal attention in blocks of BR query rows, on the own
 * GEMM's micro-kernels (see cpu_attention.h). For a block of rows
 * [r0, r1) only keys [0, r1) matter; the block's scores (BR x r1) live in a
 * per-thread scratch, never a T x T tensor, and only each row's log-sum-exp
 * is kept for backward, which recomputes the probabilities from it.
 *
 * One thread owns a (batch, head) pair at a time (static schedule), and
 * walks its query blocks in order, so the dK and dV sums over blocks run in
 * a fixed order: results are bitwise reproducible for a thread count.
 * Grouped-query attention: NKV key/value heads, query head h reading kv
 * head h / (NH/NKV). Backward hands a thread a (batch, kv head) pair and
 * walks its group's query heads in order, so dK and dV of a shared head are
 * summed by one thread, in a fixed order (at NKV = NH: what it always was). */
#include "cpu_attention.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu_gemm.h"
#include "cpu_math.h"

#define BR 64 /* query rows per block */

/* Per-thread scratch: scores / probabilities and their gradient, BR x T each. */
static float *scratch;
static size_t scratch_floats; /* per thread */
static int scratch_threads;

static int scratch_reserve(int threads, int T) {
    size_t need = 2 * (size_t)BR * (size_t)T;
    if (need <= scratch_floats && threads <= scratch_threads) return 0;
    void *p = NULL;
    if (posix_memalign(&p, 64, need * threads * sizeof(float)) != 0) return -1;
    free(scratch);
    scratch = p;
    scratch_floats = need;
    scratch_threads = threads;
    return 0;
}

/* S (rows x keys, row stride ld) = Q_blk K^T; C3 is qkv's row stride. */
static void scores(float *S, int ld, const float *q, const float *k, size_t C3, int rows, int keys,
                   int hs, int tid) {
    loom_gemm_t g = {.a = q, .rsa = (ptrdiff_t)C3, .csa = 1, .b = k, .rsb = 1, .csb = (ptrdiff_t)C3,
                     .c = S, .ldc = ld, .M = rows, .N = keys, .K = hs};
    loom_cpu_gemm_serial(&g, tid);
}

/* One attention call: shapes, and the tensors of forward or backward. */
typedef struct {
    int B, T, C, NH, NKV, hs;
    int G;       /* query heads per kv head: NH / NKV */
    size_t C3;   /* row stride of qkv: C + 2*NKV*hs (3C at NKV = NH) */
    float scale; /* 1/sqrt(hs) */
    const float *qkv;  /* (B, T, 3C) */
    float *out, *lse;  /* forward writes: (B, T, C), (B, NH, T) */
    const float *fout, *flse, *dout; /* backward reads forward's out, lse and dout (B, T, C) */
    float *dqkv;       /* backward writes: (B, T, 3C) */
} attn_t;

static attn_t attn_setup(const float *qkv, int B, int T, int C, int NH, int NKV) {
    attn_t a = {.B = B, .T = T, .C = C, .NH = NH, .NKV = NKV, .hs = C / NH, .G = NH / NKV, .qkv = qkv};
    a.C3 = (size_t)C + 2 * (size_t)NKV * a.hs;
    a.scale = 1.0f / sqrtf((float)a.hs);
    return a;
}

/* Offsets in a qkv row of query head h, and of kv head kh's keys and values. */
static size_t q_off(const attn_t *a, int h) { return (size_t)h * a->hs; }
static size_t k_off(const attn_t *a, int kh) { return (size_t)a->C + (size_t)kh * a->hs; }
static size_t v_off(const attn_t *a, int kh) { return (size_t)a->C + ((size_t)a->NKV + kh) * a->hs; }

/* Runs head(a, b, h, scratch, tid) for every (batch, head) pair, h <
 * `heads`, on a team
 * of no more than the GEMM's threads, each with its own scratch (BR x T
 * twice) reserved for length T; the static schedule keeps a pair on the
 * same thread for a thread count, so sums are reproducible. */
static void each_head(const attn_t *a, int heads, void (*head)(const attn_t *, int, int, float *, int)) {
    int nt = omp_get_max_threads();
    if (nt > loom_cpu_gemm_threads()) nt = loom_cpu_gemm_threads();
    if (scratch_reserve(nt, a->T) != 0) loom_panic(__FILE__, __LINE__, "out of memory for attention scratch (T=%d)", a->T);
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num();
        float *S = scratch + (size_t)tid * scratch_floats;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < a->B; b++)
            for (int h = 0; h < heads; h++) head(a, b, h, S, tid);
    }
}

static void forward_head(const attn_t *a, int b, int h, float *S, int tid) {
    int T = a->T, C = a->C, NH = a->NH, hs = a->hs;
    size_t C3 = a->C3;
    float scale = a->scale;
    const float *base = a->qkv + (size_t)b * T * C3;
    const float *K = base + k_off(a, h / a->G), *Vv = base + v_off(a, h / a->G);
    for (int r0 = 0; r0 < T; r0 += BR) {
        int rows = T - r0 < BR ? T - r0 : BR, keys = r0 + rows;
        scores(S, keys, base + r0 * C3 + q_off(a, h), K, C3, rows, keys, hs, tid);
        for (int r = 0; r < rows; r++) {
            float *s = S + (size_t)r * keys;
            int n = r0 + r + 1; /* causal: keys 0..i */
            float mx = -INFINITY;
            for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
            float sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < n; j++) {
                float e = loom_expf((s[j] - mx) * scale);
                s[j] = e;
                sum += e;
            }
            float inv = 1.0f / sum;
#pragma omp simd
            for (int j = 0; j < n; j++) s[j] *= inv;
            for (int j = n; j < keys; j++) s[j] = 0.0f;
            a->lse[((size_t)b * NH + h) * T + r0 + r] = mx * scale + logf(sum);
        }
        /* O_blk = P V */
        loom_gemm_t g = {.a = S, .rsa = keys, .csa = 1, .b = Vv, .rsb = (ptrdiff_t)C3, .csb = 1,
                         .c = a->out + ((size_t)b * T + r0) * C + h * hs, .ldc = C,
                         .M = rows, .N = hs, .K = keys};
        loom_cpu_gemm_serial(&g, tid);
    }
}

void loom_cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                                int NH, int NKV) {
    attn_t a = attn_setup(qkv, B, T, C, NH, NKV);
    a.out = out;
    a.lse = lse;
    each_head(&a, NH, forward_head);
}

/* P (rows x keys) from the scores and lse; dP (holding dO V^T) becomes dS. */
static void backward_probs(const attn_t *a, int b, int h, int r0, int rows, int keys, float *P, float *dP,
                           const float *dO, const float *O) {
    int T = a->T, C = a->C, NH = a->NH, hs = a->hs;
    float scale = a->scale;
    for (int r = 0; r < rows; r++) {
        float *p = P + (size_t)r * keys, *dp = dP + (size_t)r * keys;
        const float *o = O + (size_t)r * C, *d = dO + (size_t)r * C;
        float L = a->flse[((size_t)b * NH + h) * T + r0 + r], D = 0;
        /* an FMA chain in k order, as the kernels sum dP: the two cancel exactly where they should (T = 1) */
        for (int e = 0; e < hs; e++) D = fmaf(d[e], o[e], D);
        int n = r0 + r + 1;
#pragma omp simd
        for (int j = 0; j < n; j++) {
            float pj = loom_expf(p[j] * scale - L);
            p[j] = pj;
            dp[j] = pj * (dp[j] - D) * scale;
        }
        for (int j = n; j < keys; j++) p[j] = dp[j] = 0.0f;
    }
}

/* Query head h's part of backward: its dQ (overwritten), and its share of
 * dK, dV (accumulated) of the kv head it reads. */
static void backward_qhead(const attn_t *a, int b, int h, float *P, int tid) {
    int T = a->T, C = a->C, hs = a->hs;
    size_t C3 = a->C3;
    float *dP = P + (size_t)BR * T;
    const float *base = a->qkv + (size_t)b * T * C3;
    float *dbase = a->dqkv + (size_t)b * T * C3;
    const float *K = base + k_off(a, h / a->G), *Vv = base + v_off(a, h / a->G);
    float *dK = dbase + k_off(a, h / a->G), *dV = dbase + v_off(a, h / a->G);
    for (int r0 = 0; r0 < T; r0 += BR) {
        int rows = T - r0 < BR ? T - r0 : BR, keys = r0 + rows;
        const float *Q = base + r0 * C3 + q_off(a, h);
        const float *dO = a->dout + ((size_t)b * T + r0) * C + h * hs;
        const float *O = a->fout + ((size_t)b * T + r0) * C + h * hs;
        scores(P, keys, Q, K, C3, rows, keys, hs, tid);
        /* dP = dO V^T */
        loom_gemm_t g1 = {.a = dO, .rsa = C, .csa = 1, .b = Vv, .rsb = 1, .csb = (ptrdiff_t)C3,
                          .c = dP, .ldc = keys, .M = rows, .N = keys, .K = hs};
        loom_cpu_gemm_serial(&g1, tid);
        backward_probs(a, b, h, r0, rows, keys, P, dP, dO, O);
        /* dQ_blk = dS K (overwrites), dK += dS^T Q_blk, dV += P^T dO_blk */
        loom_gemm_t gq = {.a = dP, .rsa = keys, .csa = 1, .b = K, .rsb = (ptrdiff_t)C3, .csb = 1,
                          .c = dbase + r0 * C3 + q_off(a, h), .ldc = (ptrdiff_t)C3,
                          .M = rows, .N = hs, .K = keys};
        loom_cpu_gemm_serial(&gq, tid);
        loom_gemm_t gk = {.a = dP, .rsa = 1, .csa = keys, .b = Q, .rsb = (ptrdiff_t)C3, .csb = 1,
                          .c = dK, .ldc = (ptrdiff_t)C3, .M = keys, .N = hs, .K = rows,
                          .accumulate = 1};
        loom_cpu_gemm_serial(&gk, tid);
        loom_gemm_t gv = {.a = P, .rsa = 1, .csa = keys, .b = dO, .rsb = C, .csb = 1,
                          .c = dV, .ldc = (ptrdiff_t)C3, .M = keys, .N = hs, .K = rows,
                          .accumulate = 1};
        loom_cpu_gemm_serial(&gv, tid);
    }
}

/* kv head kh of batch b: zero its dK, dV, then its query heads in order. */
static void backward_kvhead(const attn_t *a, int b, int kh, float *P, int tid) {
    size_t C3 = a->C3;
    float *dbase = a->dqkv + (size_t)b * a->T * C3;
    float *dK = dbase + k_off(a, kh), *dV = dbase + v_off(a, kh);
    for (int i = 0; i < a->T; i++) {
        memset(dK + i * C3, 0, (size_t)a->hs * sizeof(float));
        memset(dV + i * C3, 0, (size_t)a->hs * sizeof(float));
    }
    for (int g = 0; g < a->G; g++) backward_qhead(a, b, kh * a->G + g, P, tid);
}

void loom_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                 const float *out, const float *lse, int B, int T, int C, int NH, int NKV) {
    attn_t a = attn_setup(qkv, B, T, C, NH, NKV);
    a.dqkv = dqkv;
    a.dout = dout;
    a.fout = out;
    a.flse = lse;
    each_head(&a, NKV, backward_kvhead);
}
