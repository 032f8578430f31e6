build-there/src/obs/nvml.o: src/obs/nvml.c src/obs/nvml.h src/core/core.h
src/obs/nvml.h:
src/core/core.h:
