/* commands: one function per subcommand, each in its own file in src/cli/.
 * Each takes the arguments after the subcommand name and returns the
 * process exit code: 0 success, 2 bad input (the message says what to do),
 * 1 anything else. */
#ifndef LOOM_COMMANDS_H
#define LOOM_COMMANDS_H

int cmd_train(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_dist(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv);
int cmd_prune(int argc, char **argv);

/* Exit code for a failed status: 2 when the user can fix the input. */
int loom_exit_code(int status);
/* A command's exit: on a failed status print "loom CMD: <message>" and
 * return loom_exit_code(status); 0 for LOOM_OK. */
int loom_exit_report(const char *cmd, int status);

#endif
