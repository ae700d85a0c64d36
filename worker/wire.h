/* The worker's RPC methods (answered by tessera-worker, called by the
 * chief), with their meta messages in proto/worker.proto:
 *
 *   WK_M_CONFIGURE  ConfigureRequest -> ConfigureResponse
 *       A new run_id drops any previous run's state; the same run_id again
 *       (the chief reconnecting) is answered at once. A format_version other
 *       than WK_FORMAT_VERSION is refused with TSR_EVERSION naming both.
 *   WK_M_RUN        RunRequest -> RunResponse
 *       Runs `steps` training steps (pull, compute, push each) and answers
 *       when they are done; at most two in flight, run one after the other.
 *   WK_M_EVAL       EvalRequest -> EvalResponse
 *   WK_M_STATUS     StatusRequest -> StatusResponse
 *   WK_M_SHUTDOWN   ShutdownRequest -> ShutdownResponse (then the process
 *                   exits 0)
 *   WK_M_DENSE      DenseRequest -> DenseResponse + payload: dense
 *                   "allreduce", the dense variables this worker holds
 *                   (values, optimizer slots, applies), between closures
 *   WK_M_DENSE_SET  DenseSetRequest + payload -> DenseSetResponse: the
 *                   same taken in (a checkpoint restored); a list or a
 *                   payload that does not match the model is TSR_ESHAPE
 *                   naming the variable, and nothing changes
 *   WK_M_RING_BREAK RingBreakRequest -> RingBreakResponse: dense
 *                   "allreduce", the ring breaks now (its closures in
 *                   flight fail naming `why`); answered at once
 * Errors travel as RPC error frames: a data file missing on this worker is
 * TSR_EIO with the path, a model the worker cannot build TSR_ECONFIG, a PS
 * that cannot be reached TSR_EUNAVAIL naming the PS.
 */
#ifndef TSR_WK_WIRE_H
#define TSR_WK_WIRE_H

#define WK_FORMAT_VERSION 1

enum {
  WK_M_CONFIGURE = 201,
  WK_M_RUN = 202,
  WK_M_EVAL = 203,
  WK_M_STATUS = 204,
  WK_M_SHUTDOWN = 205,
  WK_M_DENSE = 206,
  WK_M_DENSE_SET = 207,
  WK_M_RING_BREAK = 208
};

#endif
