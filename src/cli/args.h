/* args: one table per subcommand (name, type, target, default, bounds,
 * help) drives flag parsing, defaults and --help, so they cannot disagree. */
#ifndef LOOM_ARGS_H
#define LOOM_ARGS_H

typedef enum {
    ARG_INT,   /* int */
    ARG_LONG,  /* long long */
    ARG_FLOAT, /* double */
    ARG_STR,   /* const char * */
    ARG_BOOL,  /* int, set to 1 by the bare flag */
    ARG_LIST,  /* loom_arg_list_t: every value up to the next --flag */
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

#endif
