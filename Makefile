# loom build. `make` builds build/loom (CPU, plus the CUDA backend when nvcc
# is found); `make test` installs what the tests need and runs the suite;
# `make demo` installs, builds and trains on the default corpus.
#
# Variables: SANITIZE=address,undefined  (builds into build-san/)
#            NO_CUDA=1                    (skip the CUDA backend even if nvcc exists)
#            ARCH=-march=native           (CPU target flags)
#            NO_MPI=1                     (skip the MPI transport even if mpicc exists)
#            PREFIX=/usr/local DESTDIR=    (make install / make uninstall)
#            GIT_COMMIT=...               (what `loom --version` names when there is no git, as in an image build)
#            NO_BLAS=1                    (no OpenBLAS: LOOM_GEMM=blas is refused; the GPU bundle)

CC      ?= gcc
ARCH    ?= -march=native
OPT     ?= -O3
# Paths are built with snprintf into PATH_MAX buffers; gcc cannot prove they fit.
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wno-format-truncation
# Floating-point operations never trap here (nothing enables FP exceptions):
# without this GCC will not if-convert a clamp feeding arithmetic, so
# cpu_math.h's exp, and with it every softmax, SiLU and attention loop,
# stayed scalar. No results change: only which instructions compute them.
FPFLAGS := -fno-trapping-math
CFLAGS  := -std=gnu11 $(OPT) $(ARCH) $(FPFLAGS) -g -fopenmp $(WARN) -Isrc $(EXTRA_CFLAGS)
LDLIBS  := $(if $(NO_BLAS),,-lopenblas) -lcjson -lm -lpthread -ldl -lmicrohttpd
BUILD   := build
ifneq ($(NO_BLAS),)
  CFLAGS  += -DLOOM_NO_BLAS
endif

ifneq ($(SANITIZE),)
  BUILD   := build-san
  CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
  LDFLAGS += -fsanitize=$(SANITIZE)
  NO_CUDA := 1
endif

# MPI: the mpi transport of src/parallel/ is built when Open MPI's mpicc is found.
ifneq ($(if $(NO_MPI),,$(shell command -v mpicc 2>/dev/null)),)
  CFLAGS  += -DLOOM_HAVE_MPI $(shell mpicc --showme:compile)
  LDLIBS  += $(shell mpicc --showme:link)
endif

# CUDA: built only when nvcc is found (PATH or /usr/local/cuda), as a plugin,
# build/libloom_cuda.so, that loom loads with dlopen when a GPU is asked for
# (src/backend/plugin.h): a CPU run never maps cuBLAS, cuDNN or NCCL. The
# plugin resolves loom's own functions in the executable, which therefore
# exports them (-rdynamic) and links all of libloom.a.
NVCC := $(if $(NO_CUDA),,$(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null))
CU_SRCS := $(wildcard src/backend/cuda/*.cu)
CUDA_CPP_SRCS := $(wildcard src/backend/cuda/*.cpp) # host-only C++ of the plugin (no kernels)
PLUGIN_C_SRCS := src/parallel/dist_nccl.c
ifneq ($(and $(NVCC),$(CU_SRCS)),)
  CUDA_HOME  := $(patsubst %/bin/nvcc,%,$(NVCC))
  CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
  NVFLAGS    := -O3 -std=c++17 $(CUDA_ARCHS) -Isrc -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fPIC \
                --expt-relaxed-constexpr -Werror all-warnings $(EXTRA_NVFLAGS)
  CFLAGS     += -DLOOM_HAVE_CUDA -I$(CUDA_HOME)/include
  CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib \
                -lcublasLt -lcublas -lcudart -lstdc++
  # NCCL (src/parallel/dist_nccl.c): compiled against its header when found,
  # opened with dlopen at the first multi-GPU join, never linked (one GPU
  # needs no libnccl).
  NCCL_H     ?= $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
  ifneq ($(NCCL_H),)
    CFLAGS   += -DLOOM_HAVE_NCCL
  endif
  # cuDNN (fused attention through NVIDIA's header-only cudnn-frontend, PyPI
  # nvidia-cudnn-frontend in .deps/cudnn-fe; nvrtc for its run-time compiled
  # engines) is compiled in and linked only when those headers are found;
  # without them the own attention kernels run.
  CUDNN_FE   ?= $(wildcard .deps/cudnn-fe/include/cudnn_frontend.h)
  ifneq ($(CUDNN_FE),)
    NVFLAGS   += -DLOOM_HAVE_CUDNN_FE -isystem $(dir $(CUDNN_FE))
    CUDA_CXXFLAGS_FE := -DLOOM_HAVE_CUDNN_FE -isystem $(dir $(CUDNN_FE))
    CUDA_LIBS += -lcudnn -lnvrtc
  endif
  PLUGIN     := $(BUILD)/libloom_cuda.so
  PLUGIN_OBJS := $(CU_SRCS:%.cu=$(BUILD)/%.o) $(CUDA_CPP_SRCS:%.cpp=$(BUILD)/%.o) $(PLUGIN_C_SRCS:%.c=$(BUILD)/%.pic.o)
  CUDA_CXXFLAGS := -std=c++17 -O2 -fPIC -Isrc -I$(CUDA_HOME)/include -Wall -Wextra -Werror -Wno-unused-parameter \
                   $(CUDA_CXXFLAGS_FE) $(EXTRA_NVFLAGS)
  CUDA_NOTE  := CUDA backend built with $(NVCC) ($(CUDA_ARCHS)), cuDNN attention $(if $(CUDNN_FE),on,off: no .deps/cudnn-fe): $(PLUGIN)
  # cuSPARSELt (2:4 weights on the sparse tensor cores; PyPI nvidia-cusparselt-cu13 in .deps/cusparselt):
  # its header compiles the sparse path into cuda_sparselt.cpp; the library is opened with dlopen at run
  # time, so a machine without it runs 2:4 weights dense (src/backend/cuda/cuda_sparse24.cu).
  CUSPARSELT_H ?= $(firstword $(wildcard .deps/cusparselt/nvidia/cu*/include/cusparseLt.h .deps/cusparselt/nvidia/cusparselt/include/cusparseLt.h))
  ifneq ($(CUSPARSELT_H),)
    CUDA_CXXFLAGS += -DLOOM_HAVE_CUSPARSELT -isystem $(dir $(CUSPARSELT_H))
  endif
else
  PLUGIN     :=
  CUDA_NOTE  := CUDA backend not built ($(if $(NO_CUDA),NO_CUDA set,$(if $(NVCC),no sources in src/backend/cuda,nvcc not found))): CPU only
endif
LINK_LIB = -rdynamic -Wl,--whole-archive $(BUILD)/libloom.a -Wl,--no-whole-archive

LIB_SRCS  := $(filter-out src/cli/main.c $(PLUGIN_C_SRCS),$(shell find src -name '*.c' | sort))
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o)
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%) $(BUILD)/tests/fuzz_readers

.PHONY: all loom tests test test-fast demo deps clean bench gpu-bundle install uninstall FORCE
all: $(BUILD)/loom $(TEST_BINS) $(PLUGIN)
	@echo "$(CUDA_NOTE)"

loom: $(BUILD)/loom
tests: $(TEST_BINS)

$(BUILD)/libloom.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

# `loom --version`: VERSION and the commit, written to version.h only when
# they change, so that a new commit rebuilds main.o and nothing else.
VERSION    := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
GIT_COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
$(BUILD)/version.h: FORCE
	@mkdir -p $(BUILD)
	@printf '#define LOOM_VERSION "%s"\n#define LOOM_GIT_COMMIT "%s"\n' '$(VERSION)' '$(GIT_COMMIT)' > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@
$(BUILD)/src/cli/main.o: $(BUILD)/version.h
$(BUILD)/src/cli/main.o: CFLAGS += -I$(BUILD)

$(BUILD)/loom: $(BUILD)/src/cli/main.o $(BUILD)/libloom.a
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(BUILD)/src/cli/main.o $(LINK_LIB) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/tests/check.o $(BUILD)/libloom.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $(LDFLAGS) -o $@ $< $(BUILD)/tests/check.o $(LINK_LIB) $(LDLIBS)

# The file readers' and request parser's mutation driver (tests/test_fuzz_readers.sh, bench/fuzz-readers.sh).
$(BUILD)/tests/fuzz_readers: tests/fuzz/fuzz_readers.c tests/fuzz/fuzz_request.c $(BUILD)/libloom.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c,$^) $(LINK_LIB) $(LDLIBS)
$(BUILD)/libloom_cuda.so: $(PLUGIN_OBJS)
	$(CC) -shared -o $@ $^ $(CUDA_LIBS)

$(BUILD)/%.pic.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -MMD -MP -c -o $@ $<

$(BUILD)/tests/check.o: tests/check.c tests/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

# The C objects depend on the flags they were compiled with: a file holding
# them, rewritten only when they change (a new -f option, or NO_CUDA=1
# after a CUDA build, otherwise left objects of the other kind behind).
FLAGS_FILE := $(BUILD)/cflags
$(shell mkdir -p $(BUILD) && (echo '$(CC) $(CFLAGS)' | cmp -s - $(FLAGS_FILE) || echo '$(CC) $(CFLAGS)' > $(FLAGS_FILE)))

$(BUILD)/tests/check.o: $(FLAGS_FILE)
$(BUILD)/%.o: %.c $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CUDA_CXXFLAGS) -MMD -MP -c -o $@ $<

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# Installs the Debian packages (and PyPI packages for test oracles) that are missing.
deps:
	@scripts/deps.sh

# The README's second command: the whole suite, then the C tests again under
# the sanitizers.
test: deps
	$(MAKE) all
	$(MAKE) SANITIZE=address,undefined all
	tests/run.sh
	@# The container image test takes minutes: it runs once the Debian base is
	@# cached (README, after `make test`), says so when it is not, and fails
	@# make test when one of its cases fails.
	@if deploy/container/base.sh --check; then tests/image_test.sh 2>&1 | tee $(BUILD)/image_test.log; \
	   ! grep -q '^FAIL' $(BUILD)/image_test.log; \
	 else echo "NOT RUN image_test: no cached Debian base; run deploy/container/base.sh once, then make test runs tests/image_test.sh"; fi

# The README's first command.
demo: deps
	$(MAKE) all
	scripts/demo.sh

bench: all
	$(BUILD)/loom bench train

# The folder bench/gpu-check.sh carries to a bare GPU machine (.gpu/, see
# docs/cuda.md): binaries built here without MPI, the libraries they need
# that such a machine lacks, a small corpus, a manifest.
gpu-bundle:
	bench/gpu-bundle.sh

# make install [PREFIX=/usr/local] [DESTDIR=]: the binary, the CUDA plugin
# when built, and the files loom reads at run time, each where the installed
# binary looks for it (relative to itself: ../lib/loom, ../share/loom).
# dygraphs (the dashboard's charts) is copied from Debian's libjs-dygraphs
# when installed here, else loom looks for Debian's file at run time.
PREFIX ?= /usr/local
DYGRAPHS := /usr/share/javascript/dygraphs
install: $(BUILD)/loom $(PLUGIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/loom
	install -m 755 $(BUILD)/loom $(DESTDIR)$(PREFIX)/bin/loom
	install -m 644 src/plan/gpus.json $(DESTDIR)$(PREFIX)/share/loom/gpus.json
	$(if $(PLUGIN),install -d $(DESTDIR)$(PREFIX)/lib/loom && install -m 755 $(PLUGIN) $(DESTDIR)$(PREFIX)/lib/loom/libloom_cuda.so)
	if [ -f $(DYGRAPHS)/dygraph.min.js ]; then install -d $(DESTDIR)$(PREFIX)/share/loom/dygraphs && \
	    install -m 644 $(DYGRAPHS)/dygraph.min.js $(DESTDIR)$(PREFIX)/share/loom/dygraphs/ && \
	    { [ ! -f $(DYGRAPHS)/dygraph.css ] || install -m 644 $(DYGRAPHS)/dygraph.css $(DESTDIR)$(PREFIX)/share/loom/dygraphs/; }; fi

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/loom $(DESTDIR)$(PREFIX)/lib/loom/libloom_cuda.so
	rm -rf $(DESTDIR)$(PREFIX)/share/loom
	-rmdir $(DESTDIR)$(PREFIX)/lib/loom 2>/dev/null

clean:
	rm -rf build build-san build-gpu
