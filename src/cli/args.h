/* args: one table per subcommand (name, type, target, default, bounds,
 * help) drives flag parsing, defaults and --help, so they cannot disagree.
 * A flag that several commands take (--batch, --threads, --dtype, the
 * optimizer's) is declared once in the shared table (loom_flag) with one
 * bound and one help text, and each command's table binds it to its own
 * variable. Enumerated flags (ARG_CHOICE) are checked here, by the parser,
 * and nowhere else: what reaches a command is already a valid number. */
#ifndef LOOM_ARGS_H
#define LOOM_ARGS_H

typedef enum {
    ARG_INT,   /* int */
    ARG_LONG,  /* long long */
    ARG_FLOAT, /* double */
    ARG_STR,   /* const char * */
    ARG_BOOL,  /* int, set to 1 by the bare flag */
    ARG_LIST,  /* loom_arg_list_t: every value up to the next --flag */
    ARG_CHOICE, /* int: min + the index of the value among the flag's choices ("none|gelu|all");
                * only for shared flags, whose choices the shared table holds */
    ARG_OPTSTR /* const char *, the value optional: the bare flag (or one followed by a --flag) stores "latest" */
} loom_arg_type;

typedef struct {
    const char **v;
    int n;
} loom_arg_list_t;

typedef struct {
    const char *name; /* without the leading "--" */
    loom_arg_type type;
    void *ptr;
    const char *def;  /* default as text (NULL = none / required) */
    double min, max;  /* bounds for numbers (min == max: unbounded) */
    const char *help;
} loom_arg_t;

/* The flags shared by several commands. */
typedef enum {
    LOOM_FLAG_RUN,          /* --run: a run folder */
    LOOM_FLAG_DATA,         /* --data: text file or token shard folder */
    LOOM_FLAG_MODEL,        /* --model: a preset */
    LOOM_FLAG_BATCH,        /* --batch: sequences per (micro-)batch */
    LOOM_FLAG_SEQ,          /* --seq: tokens per sequence */
    LOOM_FLAG_STEPS,        /* --steps: optimizer steps */
    LOOM_FLAG_THREADS,      /* --threads: CPU threads */
    LOOM_FLAG_DEVICE,       /* --device: cpu, cuda, cuda:N */
    LOOM_FLAG_DTYPE,        /* --dtype: ARG_CHOICE, -1 = auto, else loom_dtype */
    LOOM_FLAG_SEED,         /* --seed */
    LOOM_FLAG_VAL_FRACTION, /* --val-fraction: held-out share of a text file */
    LOOM_FLAG_LR,           /* optimizer: --lr, --min-lr-ratio, --warmup, --weight-decay, --beta1, --beta2, --clip */
    LOOM_FLAG_MIN_LR_RATIO,
    LOOM_FLAG_WARMUP,
    LOOM_FLAG_WEIGHT_DECAY,
    LOOM_FLAG_BETA1,
    LOOM_FLAG_BETA2,
    LOOM_FLAG_CLIP,
    LOOM_FLAG_RECOMPUTE,    /* --recompute: ARG_CHOICE, a loom_recompute */
    LOOM_FLAG_CUDA_GRAPHS,  /* --cuda-graphs: ARG_CHOICE, -1 default, 0 off, 1 on */
    LOOM_FLAG_ZERO,         /* --zero: ZeRO stage */
    LOOM_FLAG_GRAD_DTYPE,   /* --grad-dtype: ARG_CHOICE, a loom_dist_dtype */
    LOOM_FLAG_QUANT,        /* --quant: ARG_CHOICE, index into none|int8|w8a32|w8a16|w8a8 (loom_cli_open_opts) */
    LOOM_FLAG_KV_DTYPE,     /* --kv-dtype: ARG_CHOICE, 0 fp32, 1 int8 */
    LOOM_FLAG_KV_MEMORY,    /* --kv-memory: text, bytes or a share of free memory (loom_engine_parse_kv_memory) */
    LOOM_FLAG_BLOCK_SIZE,   /* --block-size: int, tokens per KV block (the engine's bound) */
    LOOM_FLAG_MAX_BATCH_TOKENS, /* --max-batch-tokens: int, rows per engine step */
    LOOM_FLAG_MAX_SEQS,     /* --max-seqs: int, running sequences at most */
    LOOM_FLAG_PREFILL_RATIO, /* --prefill-ratio: double, prompt work per step while sequences decode */
    LOOM_FLAG_SPARSE,       /* --sparse: ARG_CHOICE, LOOM_SPARSE_OFF 0 or LOOM_SPARSE_AUTO 1 (model/sparse24.h) */
    LOOM_FLAG_COUNT
} loom_flag_id;

/* The shared flag `id`, bound to `ptr` (of the flag's type). */
loom_arg_t loom_flag(loom_flag_id id, void *ptr);
/* The same with another default (a benchmark's smaller batch). */
loom_arg_t loom_flag_default(loom_flag_id id, void *ptr, const char *def);

/* The optimizer's flags (--lr, --min-lr-ratio, --warmup, --weight-decay,
 * --beta1, --beta2, --clip, in this order) bound to the same-named fields
 * of the struct `o` points at: rows for a training command's table. */
#define LOOM_OPTIMIZER_FLAGS(o)                                                                          \
    loom_flag(LOOM_FLAG_LR, &(o)->lr), loom_flag(LOOM_FLAG_MIN_LR_RATIO, &(o)->min_lr_ratio),             \
        loom_flag(LOOM_FLAG_WARMUP, &(o)->warmup), loom_flag(LOOM_FLAG_WEIGHT_DECAY, &(o)->weight_decay),  \
        loom_flag(LOOM_FLAG_BETA1, &(o)->beta1), loom_flag(LOOM_FLAG_BETA2, &(o)->beta2),                  \
        loom_flag(LOOM_FLAG_CLIP, &(o)->clip)

/* Parse argv (after the subcommand name) against the table; defaults are
 * applied first. Returns 0 when parsed, 1 when --help was printed, 2 on a
 * bad flag (a one-line error naming it has been printed). Positional
 * arguments are an error unless the table has an entry named "" (ARG_LIST). */
int loom_args_parse(const char *cmd, const char *usage, const loom_arg_t *args, int n,
                    int argc, char **argv);
/* Print "usage" and every flag with its default and help. */
void loom_args_help(const char *cmd, const char *usage, const loom_arg_t *args, int n);
/* 1 if the flag named `name` was given on the command line in the last parse. */
int loom_args_given(const char *name);

/* The rows of a flag table declared as an array (not a pointer). */
#define LOOM_ARGS_COUNT(args) ((int)(sizeof(args) / sizeof((args)[0])))
/* A command's flag parse, as one statement: parse argv against the array
 * `args`; after --help the calling command returns 0, after a bad flag 2
 * (loom_args_parse has printed the one-line error); else it goes on. */
#define LOOM_ARGS_PARSE_OR_RETURN(cmd, usage, args, argc, argv)                                \
    do {                                                                                       \
        int parsed_ = loom_args_parse(cmd, usage, args, LOOM_ARGS_COUNT(args), argc, argv);     \
        if (parsed_) return parsed_ == 1 ? 0 : 2;                                              \
    } while (0)

#endif
