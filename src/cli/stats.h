/* stats: order statistics of measured figures, for the benches and
 * `loom plan --measured` (one comparison function instead of one per file). */
#ifndef LOOM_CLI_STATS_H
#define LOOM_CLI_STATS_H

/* Sort v (n doubles) ascending, in place. */
void loom_sort_doubles(double *v, int n);
/* The median of v (sorted in place): the middle value, or the mean of the
 * two middle ones for even n; 0 for n == 0. */
double loom_median(double *v, int n);

#endif
