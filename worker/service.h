/* tessera-worker's distributed mode: the RPC service the chief calls
 * (worker/wire.h, proto/worker.proto) and the training thread behind it.
 *
 * Happy path: wk_service_main() resolves the cluster (TF_CONFIG, or
 * --cluster/--task; the task must be a worker), reads the cluster token
 * (TESSERA_TOKEN or --token-file), registers every worker method and only
 * then listens on its own address from the cluster spec. The chief
 * configures it for a run, then hands it closures of K steps, evaluations
 * and status queries until it asks it to shut down.
 * Failure modes: a bad cluster spec, token or flag exits at once with a
 * message naming it (status 2); a port already taken exits 1. Errors of a
 * run (data, model, PS) are answered to the chief and the worker keeps
 * serving. SIGTERM and SIGINT close every handle and exit 0.
 */
#ifndef TSR_WK_SERVICE_H
#define TSR_WK_SERVICE_H

/* Runs the worker service until SIGTERM/SIGINT or WK_M_SHUTDOWN; returns
 * the process exit status. Flags: --cluster FILE, --task worker:N,
 * --token-file FILE, --device auto|cpu|gpu, --ps-deadline-ms MS (deadline
 * of every PS call; sync-mode pulls wait for the slowest worker within
 * it), --listen HOST:PORT (default: tsr_task_listen_addr of the task's
 * address: an IP literal itself, a name every address, IPv6 and IPv4),
 * --idle-exit DURATION (leave, status 0, when no chief has answered for
 * that long). */
int wk_service_main(int argc, char **argv);

/* True unless argv asks for the standalone trainer (--standalone), so
 * main() can hand every other command line to wk_service_main(). */
int wk_service_selected(int argc, char **argv);

#endif
