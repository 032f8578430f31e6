/* cpu_attention: the CPU backend's causal attention, forward and backward,
 * in blocks of query rows on the own GEMM kernels (no T x T tensor; only
 * each row's log-sum-exp is kept). Same contract as attention_forward and
 * attention_backward in backend.h. Internal to src/backend/cpu/. */
#ifndef LOOM_CPU_ATTENTION_H
#define LOOM_CPU_ATTENTION_H

void loom_cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                                int NH, int NKV);
void loom_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                 const float *out, const float *lse, int B, int T, int C, int NH, int NKV);

#endif
