/* The `tessera` front door: one function per subcommand. Each takes the
 * arguments after its name and returns the process exit status
 * (0 ok, 1 failure, 2 usage or configuration error). */
#ifndef TSR_CHIEF_CLI_H
#define TSR_CHIEF_CLI_H

int chief_cmd_cluster(int argc, char **argv);
int chief_cmd_partition(int argc, char **argv);
int chief_cmd_ckpt(int argc, char **argv);
int chief_cmd_status(int argc, char **argv);
int chief_cmd_local(int argc, char **argv);
int chief_cmd_report(int argc, char **argv);
int chief_cmd_evaluate(int argc, char **argv);
int chief_cmd_predict(int argc, char **argv);

#endif
