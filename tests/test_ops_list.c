/* test_ops_list: the op list (src/backend/ops.h) and what is made from it.
 * - the CPU backend fills every required entry and passes the open-time
 *   check; emptying any one required entry makes the check fail with a
 *   message naming that op;
 * - capability flags that disagree with the table are refused;
 * - the list as data (loom_op_info) agrees with the table: names unique,
 *   slots found by id, optional entries say what happens without them,
 *   argument counts and tags in range;
 * - typed tensors: an argument's element type as the backend states it;
 *   int8 with one scale per row and per block of 32, 2:4 sparse, bf16 and
 *   fp16 dequantize to hand-computed values; inconsistent descriptors are
 *   refused with a reason; a backend whose activation type it cannot
 *   take is refused. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"

static const loom_backend_t *cpu;

static void cpu_table_is_complete(void) {
    CHECK(loom_backend_check(cpu) == LOOM_OK, "%s", loom_errmsg());
}

/* Clear entry `op` of a copy of the CPU table (through its slot address). */
static void clear_slot(loom_backend_t *b, loom_op_id op) {
    switch (op) {
#define CLEAR_(name, ret, kind, fallback, flops, n, args) \
    case LOOM_OP_##name: b->name = NULL; break;
        LOOM_OPS(CLEAR_)
#undef CLEAR_
    default: break;
    }
}

static void missing_required_op_is_named(void) {
    int required = 0;
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        const loom_op_info_t *info = loom_op_info((loom_op_id)op);
        if (!info->required) continue;
        required++;
        loom_backend_t b = *cpu;
        clear_slot(&b, (loom_op_id)op);
        CHECK(loom_backend_slot(&b, (loom_op_id)op) == NULL, "%s: slot not cleared", info->name);
        loom_status st = loom_backend_check(&b);
        CHECK(st == LOOM_EINTERNAL && strstr(loom_errmsg(), info->name), "without %s: status %d, message \"%s\"",
              info->name, st, loom_errmsg());
    }
    CHECK(required >= 20, "only %d required ops", required);
}

static void caps_must_match_the_table(void) {
    loom_backend_t b = *cpu;
    b.caps |= LOOM_CAP_GRAPHS;
    CHECK(loom_backend_check(&b) == LOOM_EINTERNAL && strstr(loom_errmsg(), "graph_begin"), "GRAPHS without graph entries: %s",
          loom_errmsg());
    b = *cpu;
    b.sumsq_dev = (void (*)(float *, const float *, size_t))b.accumulate; /* any non-NULL entry */
    CHECK(loom_backend_check(&b) == LOOM_EINTERNAL && strstr(loom_errmsg(), "sumsq_dev"), "DEV entry without the flag: %s",
          loom_errmsg());
}

static void op_info_agrees_with_the_table(void) {
    CHECK(loom_op_info(LOOM_OP_COUNT) == NULL, "info past the end");
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        const loom_op_info_t *a = loom_op_info((loom_op_id)op);
        CHECK(a && a->name && *a->name, "op %d has no name", op);
        for (int k = 0; k < op; k++) CHECK(strcmp(a->name, loom_op_info((loom_op_id)k)->name) != 0, "%s listed twice", a->name);
        CHECK(a->required == (a->kind == LOOM_OPK_MEM || a->kind == LOOM_OPK_OP || a->kind == LOOM_OPK_HOST), "%s: required %d, kind %d",
              a->name, a->required, a->kind);
        CHECK(a->required ? !*a->fallback : *a->fallback != 0, "%s: fallback \"%s\"", a->name, a->fallback);
        CHECK(a->nargs >= 0 && a->nargs <= LOOM_OP_MAX_ARGS, "%s: %d arguments", a->name, a->nargs);
        for (int i = 0; i < a->nargs; i++)
            CHECK(a->arg_names[i] && *a->arg_names[i] && (unsigned)a->arg_tags[i] <= LOOM_ARG_HP, "%s: argument %d", a->name, i);
    }
    CHECK(loom_backend_slot(cpu, LOOM_OP_matmul_forward) == (void *)cpu->matmul_forward, "slot of matmul_forward");
    CHECK(loom_backend_slot(cpu, LOOM_OP_sumsq) == (void *)cpu->sumsq, "slot of sumsq");
    CHECK(loom_backend_slot(cpu, LOOM_OP_graph_begin) == NULL, "the CPU has no graphs");
    const loom_op_info_t *mm = loom_op_info(LOOM_OP_matmul_forward);
    CHECK(mm->nargs == 7 && !strcmp(mm->arg_names[2], "w") && mm->arg_tags[2] == LOOM_ARG_F32 && mm->arg_tags[0] == LOOM_ARG_ACT,
          "matmul_forward's arguments as data");
}

static void arg_dtypes_follow_the_tags(void) {
    CHECK(loom_op_arg_dtype(cpu, LOOM_OP_matmul_forward, 0) == LOOM_FP32, "ACT out on the CPU");
    CHECK(loom_op_arg_dtype(cpu, LOOM_OP_encoder_forward, 1) == LOOM_INT32, "I32 tokens");
    CHECK(loom_op_arg_dtype(cpu, LOOM_OP_matmul_forward, 4) == -1, "VAL N has no element type");
    CHECK(loom_op_arg_dtype(cpu, LOOM_OP_matmul_forward, 7) == -1, "past the last argument");
    loom_backend_t b = *cpu;
    b.dtypes |= LOOM_DTYPE_BIT(LOOM_BF16);
    b.act_dtype = LOOM_BF16; /* what the CUDA bf16 activation path will declare */
    CHECK(loom_backend_check(&b) == LOOM_OK, "bf16 activations declared: %s", loom_errmsg());
    CHECK(loom_op_arg_dtype(&b, LOOM_OP_gelu_forward, 0) == LOOM_BF16, "ACT follows act_dtype");
    CHECK(loom_op_arg_dtype(&b, LOOM_OP_layernorm_forward, 1) == LOOM_FP32, "F32 mean stays fp32");
    b.dtypes = LOOM_DTYPE_BIT(LOOM_FP32) | LOOM_DTYPE_BIT(LOOM_INT32);
    CHECK(loom_backend_check(&b) == LOOM_EINTERNAL && strstr(loom_errmsg(), "bf16"), "act_dtype outside dtypes: %s", loom_errmsg());
    CHECK(loom_dtype_parse("int8") == -1 && loom_dtype_parse("bf16") == LOOM_BF16, "only precisions parse");
    CHECK(loom_dtype_size(LOOM_INT8) == 1 && loom_dtype_size(LOOM_BF16) == 2 && loom_dtype_size(LOOM_TF32) == 4, "sizes");
}

static void int8_tensors_dequantize(void) {
    /* A 2 x 64 int8 weight: per row, then per block of 32. */
    signed char q[128];
    for (int i = 0; i < 128; i++) q[i] = (signed char)((i % 7) - 3);
    float row_scales[2] = {0.5f, 2.0f}, block_scales[4] = {1.0f, 0.25f, -1.0f, 4.0f}, out[128];
    loom_tensor_t t = {.data = q, .dtype = LOOM_INT8, .rows = 2, .cols = 64, .scales = row_scales};
    CHECK(loom_tensor_check(&t, "w") == LOOM_OK, "%s", loom_errmsg());
    loom_tensor_dequantize(&t, out);
    int bad = 0;
    for (int i = 0; i < 128; i++) bad += out[i] != q[i] * row_scales[i / 64];
    CHECK(!bad, "per-row: %d wrong (out[64] = %g, want %g)", bad, out[64], q[64] * 2.0f);
    t.scales = block_scales;
    t.block = 32;
    loom_tensor_dequantize(&t, out);
    bad = 0;
    for (int i = 0; i < 128; i++) bad += out[i] != q[i] * block_scales[i / 32];
    CHECK(!bad, "per-block(32): %d wrong (out[100] = %g, want %g)", bad, out[100], q[100] * 4.0f);
    t.block = 24;
    CHECK(loom_tensor_check(&t, "w") == LOOM_EINVAL && strstr(loom_errmsg(), "block 24"), "%s", loom_errmsg());
    t.block = 0;
    t.scales = NULL;
    CHECK(loom_tensor_check(&t, "w") == LOOM_EINVAL && strstr(loom_errmsg(), "without scales"), "%s", loom_errmsg());
    t.dtype = LOOM_INT32;
    CHECK(loom_tensor_check(&t, "w") == LOOM_EINVAL, "int32 typed tensor accepted");
}

static void sparse_and_half_tensors_dequantize(void) {
    /* One row of 8 in 2:4: keep columns 1, 3 of the first group, 0, 2 of the second. */
    float kept[4] = {1.5f, -2.0f, 3.0f, 4.25f}, out[8];
    unsigned char meta[1] = {(1 | 3 << 2) | (0 | 2 << 2) << 4}; /* two groups per byte, the first low */
    loom_tensor_t t = {.data = kept, .dtype = LOOM_FP32, .rows = 1, .cols = 8, .layout = LOOM_LAYOUT_SPARSE24, .meta = meta};
    CHECK(loom_tensor_check(&t, "w") == LOOM_OK, "%s", loom_errmsg());
    loom_tensor_dequantize(&t, out);
    const float want[8] = {0, 1.5f, 0, -2.0f, 3.0f, 0, 4.25f, 0};
    CHECK(!memcmp(out, want, sizeof want), "2:4: %g %g %g %g %g %g %g %g", out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]);
    t.cols = 6;
    CHECK(loom_tensor_check(&t, "w") == LOOM_EINVAL, "2:4 with 6 columns accepted");
    /* bf16 0x3FC0 = 1.5, 0xC000 = -2; fp16 0x3E00 = 1.5, 0xC000 = -2, 0x0001 = 2^-24. */
    unsigned short bf[2] = {0x3FC0, 0xC000}, hf[3] = {0x3E00, 0xC000, 0x0001};
    loom_tensor_t b = {.data = bf, .dtype = LOOM_BF16, .rows = 1, .cols = 2};
    loom_tensor_dequantize(&b, out);
    CHECK(out[0] == 1.5f && out[1] == -2.0f, "bf16: %g %g", out[0], out[1]);
    loom_tensor_t h = {.data = hf, .dtype = LOOM_FP16, .rows = 1, .cols = 3};
    loom_tensor_dequantize(&h, out);
    CHECK(out[0] == 1.5f && out[1] == -2.0f && out[2] == 0x1p-24f, "fp16: %g %g %g", out[0], out[1], out[2]);
    h.scales = kept;
    CHECK(loom_tensor_check(&h, "h") == LOOM_EINVAL && strstr(loom_errmsg(), "no scales"), "fp16 with scales: %s", loom_errmsg());
}

/* `--check-rules`: the harness's SKIP rules on made-up statuses, for
 * tests/test_skip_rules.sh (these cases are meant to fail and skip). */
static void rule_other_error_fails(void) {
    loom_error(LOOM_EINVAL, "made-up invalid argument");
    check_available(LOOM_EINVAL, 1);
}
static void rule_unavailable_gpu_skips(void) {
    loom_error(LOOM_EUNAVAIL, "made-up: no GPU");
    check_available(LOOM_EUNAVAIL, 1);
}
static void rule_unavailable_part_skips(void) {
    loom_error(LOOM_EUNAVAIL, "made-up: no MPI");
    check_available(LOOM_EUNAVAIL, 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--check-rules") == 0) {
        RUN(rule_other_error_fails);
        RUN(rule_unavailable_gpu_skips);
        RUN(rule_unavailable_part_skips);
        return check_main_end();
    }
    if (loom_backend_cpu_init(&cpu, 1) != LOOM_OK) {
        printf("FAIL cpu backend: %s\n", loom_errmsg());
        return 1;
    }
    RUN(cpu_table_is_complete);
    RUN(missing_required_op_is_named);
    RUN(caps_must_match_the_table);
    RUN(op_info_agrees_with_the_table);
    RUN(arg_dtypes_follow_the_tags);
    RUN(int8_tensors_dequantize);
    RUN(sparse_and_half_tensors_dequantize);
    return check_main_end();
}
