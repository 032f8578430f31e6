/* clock: the time that decisions read -- checkpoint intervals
 * (--ckpt-every-minutes), the server's grace period and request deadlines
 * (--grace, --request-timeout), the ranks' watchdog (--dist-timeout).
 * Measurements (tokens/s, latencies, step times) read loom_now() instead:
 * they report how fast the machine is, while a decision must not depend
 * on it in a test.
 *
 * LOOM_TEST_CLOCK lets a test drive this clock, so that no test depends on
 * the speed of the machine it runs on:
 *   unset or empty  the monotonic clock (loom_now)
 *   "file:PATH"     the number of seconds written in PATH, read at every
 *                   call (0 while PATH is missing or holds no number): time
 *                   stands still until the test writes a later number
 *   "tick:S"        starts at 0 and moves S seconds at each loom_clock_tick(),
 *                   which the training loop calls once after every step:
 *                   each step "takes" S seconds
 * Any other value is warned about once and the monotonic clock is used. */
#ifndef LOOM_CLOCK_H
#define LOOM_CLOCK_H

/* Seconds on the decision clock (monotonic; the origin is arbitrary). */
double loom_clock_now(void);
/* One unit of simulated work has passed: moves a "tick:S" clock by S
 * seconds; does nothing on the other clocks. */
void loom_clock_tick(void);

#endif
