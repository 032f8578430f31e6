build-there/src/cli/devices.o: src/cli/devices.c src/backend/backend.h \
 src/backend/../core/core.h src/backend/ops.h src/backend/plugin.h \
 src/cli/args.h src/cli/commands.h src/core/core.h src/obs/nvml.h \
 src/obs/rapl.h src/backend/cuda/cuda_devices.h \
 src/backend/cuda/cuda_peak.h
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/backend/plugin.h:
src/cli/args.h:
src/cli/commands.h:
src/core/core.h:
src/obs/nvml.h:
src/obs/rapl.h:
src/backend/cuda/cuda_devices.h:
src/backend/cuda/cuda_peak.h:
