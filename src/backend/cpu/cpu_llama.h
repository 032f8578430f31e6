/* cpu_llama: the CPU's ops of the Llama family's block (contracts in
 * backend.h): RMSNorm, rotary position embedding and SwiGLU, forward and
 * backward. Internal to src/backend/cpu/. */
#ifndef LOOM_CPU_LLAMA_H
#define LOOM_CPU_LLAMA_H

void loom_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void loom_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int N, int C);
void loom_cpu_rope_forward(float *qkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs);
void loom_cpu_rope_backward(float *dqkv, const int *pos, const float *freq, int N, int NH, int NKV, int hs);
void loom_cpu_swiglu_forward(float *out, const float *inp, int N, int H);
void loom_cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int H);

#endif
