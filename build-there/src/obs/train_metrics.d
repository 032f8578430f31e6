build-there/src/obs/train_metrics.o: src/obs/train_metrics.c \
 src/obs/train_metrics.h src/obs/metrics.h src/core/core.h \
 src/obs/telemetry.h src/obs/dashboard.h src/obs/http.h
src/obs/train_metrics.h:
src/obs/metrics.h:
src/core/core.h:
src/obs/telemetry.h:
src/obs/dashboard.h:
src/obs/http.h:
