build-there/src/obs/metrics_log.o: src/obs/metrics_log.c \
 src/obs/metrics_log.h src/core/core.h
src/obs/metrics_log.h:
src/core/core.h:
