/* rapl: CPU package energy from Linux's powercap interface
 * (/sys/class/powercap/intel-rapl:N/energy_uj, also used for AMD CPUs),
 * for energy per token on the CPU. LOOM_POWERCAP_ROOT names another folder
 * laid out the same way (the tests use one).
 *
 * Only the top-level package domains are summed (their sub-domains, core
 * and uncore, are inside them). Each counter wraps at its
 * max_energy_range_uj; reading at least once per wrap period (minutes at
 * full load) keeps the total right. */
#ifndef LOOM_RAPL_H
#define LOOM_RAPL_H

#include "core/core.h"

typedef struct loom_rapl loom_rapl_t;

/* Find the package domains and read them once. LOOM_EUNAVAIL with the
 * reason (no powercap folder, no package domain, counters readable only
 * by root) when none can be read. */
loom_status loom_rapl_open(loom_rapl_t **out);
/* Joules used by all packages since loom_rapl_open (wraps accounted). */
double loom_rapl_energy_j(loom_rapl_t *r);
/* Number of package domains summed. */
int loom_rapl_domains(const loom_rapl_t *r);
void loom_rapl_close(loom_rapl_t *r);

#endif
