build-there/src/obs/telemetry.o: src/obs/telemetry.c src/obs/telemetry.h \
 src/obs/metrics.h src/core/core.h src/obs/nvml.h src/obs/rapl.h
src/obs/telemetry.h:
src/obs/metrics.h:
src/core/core.h:
src/obs/nvml.h:
src/obs/rapl.h:
