/* plot: a loss curve as a self-contained SVG file (no plotting library). */
#ifndef LOOM_PLOT_H
#define LOOM_PLOT_H

#include "core/core.h"

/* Train loss (n points at steps[i]) and validation loss (nv points) on one
 * chart, written atomically to `path`. */
loom_status loom_plot_loss_svg(const char *path, const char *title, const double *steps,
                               const double *loss, int n, const double *vsteps,
                               const double *vloss, int nv);

#endif
