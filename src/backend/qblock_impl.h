/* qblock_impl: the per-block scale extraction of qblock.h as inline
 * functions, for the kernels that call it once per block in their inner
 * loop (cpu/cpu_kquant.c); loom_qblock_scales is the same function. Internal
 * to src/backend/. */
#ifndef LOOM_QBLOCK_IMPL_H
#define LOOM_QBLOCK_IMPL_H

#include <string.h>

#include "qblock.h"

static inline float qblock_f16(const uint8_t *p) {
    _Float16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* The 6-bit scale and min of sub-block j of a q4_K/q5_K block's 12 bytes. */
static inline void qblock_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static inline void loom_qblock_scales_inline(loom_dtype d, const void *blk, loom_qblock_scales_t *s) {
    const uint8_t *b = blk;
    s->n = d >= LOOM_Q4_K ? 256 : 32; /* a 32-value block fills groups 0 and 1 only */
    if (s->n == 32) {
        int hasmin = d == LOOM_Q4_1 || d == LOOM_Q5_1;
        s->d = qblock_f16(b);
        s->dmin = hasmin ? -qblock_f16(b + 2) : s->d;
        s->sc[0] = s->sc[1] = 1;
        s->mn[0] = s->mn[1] = (int16_t)(hasmin ? 1 : d == LOOM_Q4_0 ? 8 : 16);
        return;
    }
    if (d == LOOM_Q6_K) {
        s->d = s->dmin = qblock_f16(b + 208);
        for (int g = 0; g < 16; g++) {
            s->sc[g] = (int8_t)b[192 + g];
            s->mn[g] = (int16_t)(32 * s->sc[g]);
        }
        return;
    }
    s->d = qblock_f16(b), s->dmin = qblock_f16(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        qblock_scale_min_k4(j, b + 4, &sc, &m);
        s->sc[2 * j] = s->sc[2 * j + 1] = (int16_t)sc;
        s->mn[2 * j] = s->mn[2 * j + 1] = (int16_t)m;
    }
}

#endif
