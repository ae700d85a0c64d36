/* Private to the PS client library (client.c, client_kv.c): what the
 * client needs of the wire schema, without any of the server's internals.
 */
#ifndef TSR_PS_CLIENT_INT_H
#define TSR_PS_CLIENT_INT_H

#include "ps.pb-c.h"
#include "ps/client.h"

/* Fills `v` (and the caller-provided sub-messages) from a spec; strings
 * point into the spec (client_spec.c). */
void ps__client_spec_to_proto(const ps_var_spec *s, Tessera__Ps__VarSpec *v,
                              Tessera__Ps__Initializer *in,
                              Tessera__Ps__Optimizer *o,
                              Tessera__Ps__LrSchedule *sched,
                              int64_t *shape_buf);

/* Widens n bfloat16 values held in the first 2n bytes of buf into n
 * float32 in place (bf16.c). */
void ps__bf16_expand(float *buf, size_t n);

#endif
