/* The chief's RPC methods (answered by tessera-chief on its address from
 * the cluster spec), with their metas in proto/chief.proto:
 *   CHIEF_M_STATUS  StatusRequest -> StatusResponse: the run's phase, step,
 *                   rates and how the chief sees every worker and PS.
 */
#ifndef TSR_CHIEF_WIRE_H
#define TSR_CHIEF_WIRE_H

enum { CHIEF_M_STATUS = 301 };

#endif
