/* test_ops_list: the op list (src/backend/ops.h) and what is made from it.
 * - the CPU backend fills every required entry and passes the open-time
 *   check; emptying any one required entry makes the check fail with a
 *   message naming that op;
 * - capability flags that disagree with the table are refused;
 * - the list as data (loom_op_info) agrees with the table: names unique,
 *   slots found by id, optional entries say what happens without them,
 *   argument counts and tags in range. */
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

int main(void) {
    if (loom_backend_cpu_init(&cpu, 1) != LOOM_OK) {
        printf("FAIL cpu backend: %s\n", loom_errmsg());
        return 1;
    }
    RUN(cpu_table_is_complete);
    RUN(missing_required_op_is_named);
    RUN(caps_must_match_the_table);
    RUN(op_info_agrees_with_the_table);
    return check_main_end();
}
