# siliceo — one top-level Makefile. Objects go under build/, never into the tree.
#
#   make            all binaries and libraries
#   make check      every test that needs no GPU (units, the units again under ASan + UBSan,
#                   parity, integration, short fuzz)
#   make check-asan only the unit tests built with ASan + UBSan (-O1, objects under build/asan/)
#   make check-asan-integration  the integration tests against the ASan + UBSan daemon and tools
#   make check-tsan the daemon's integration tests against its ThreadSanitizer build
#   make check-cuda every CUDA kernel against the CPU reference (needs a GPU), then again with the
#                   compute_75 PTX forced through the driver's JIT
#   make deps       install the Debian packages the project builds and tests with
#   make demo       build, start siliceod on the shipped trained model (models/), ask it questions
#                   of each task family (answers next to the right ones), show the thinking budget
#   make demo-random  the same daemon on a random-weight model of the benchmark demo shape (made
#                   once into state/): the real engine, noise for text. Both keep the daemon's
#                   state (a heat map per model, sessions) in $(B)/demo-state, never the system's
#   make install    PREFIX=/usr/local DESTDIR= (binaries, library, man pages, completions,
#                   Neovim plugin, probe script)
#   make install-service  install, plus the systemd units (siliceod's, sil-openai's), sysusers.d and
#                   tmpfiles.d entries and /etc/siliceo/siliceod.conf; without DESTDIR it also
#                   creates the user and dirs
#   make deb        the Debian packages (dpkg-buildpackage), into $(B)/deb/
#   make fuzz       run every fuzz target for FUZZ_SECONDS (default 300) each
#   make format     clang-format the sources
#
# Sources are found by directory, so a new file needs no Makefile edit:
#   kernels/*.c, kernels/cpu/*.c -> build/lib/libsil-kernels.a   (*_avx2.c / *_avx512.c get their
#                         ISA flags; kernels/*.c is what every layer shares, e.g. the error type)
#   daemon/engine/*.c  -> build/lib/libsil-engine.a
#   libproto/*.c       -> build/lib/libsiliceo-proto.a
#   daemon/*.c         -> build/bin/siliceod           (daemon/main.c holds main)
#   client/common/*.c  -> linked into every client; client/sil-X.c + client/sil-X/*.c -> build/bin/sil-X
#                         (LDLIBS_sil-X: extra link flags of that one client)
#   bench/sil-X.c + bench/sil-X/*.c -> build/bin/sil-X; bench/common/*.c -> linked into every bench tool
#   tests/test_X.c (+ tests/testutil.c) -> build/tests/test_X
#   tests/fuzz/fuzz_X.c -> build/fuzz/fuzz_X (clang, libFuzzer + ASan + UBSan)
#   kernels/cuda/*.cu  -> one fatbin (nvcc), embedded with kernels/cuda/*.c in build/lib/libsil-cuda.a
#                         when CUDA=1 (the default when nvcc is found); CUDA=0 leaves CUDA out

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= $(PREFIX)/sbin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share
SYSCONFDIR ?= /etc
# systemd searches /usr/local/lib/... too; Debian 12 keeps units in /lib/systemd/system.
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
# On Neovim's default 'packpath': `:packadd siliceo` loads the plugin.
NVIMDIR ?= $(DATADIR)/nvim/site/pack/siliceo/opt/siliceo

VERSION := 0.1.0
CC ?= cc
FUZZ_CC ?= clang
B := build

NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA ?= $(if $(NVCC),1,0)

PKGS := msgpack libsystemd libpcre2-8 libedit
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)

WARN := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS ?= -O2 -g
BASE_CFLAGS := -std=gnu11 -fPIC $(WARN) -MMD -MP -I. -Ilibproto \
	-D_GNU_SOURCE -DSIL_VERSION=\"$(VERSION)\" $(PKG_CFLAGS)
ALL_CFLAGS = $(BASE_CFLAGS) $(CFLAGS)
LDLIBS_ENGINE := $(shell pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8) -lpthread -lm -ldl
LDLIBS_PROTO := $(shell pkg-config --libs msgpack 2>/dev/null || echo -lmsgpackc)
LDLIBS_DAEMON := $(shell pkg-config --libs libsystemd 2>/dev/null || echo -lsystemd)
LDLIBS_EDIT := $(shell pkg-config --libs libedit 2>/dev/null || echo -ledit)
# Only sil-openai speaks HTTP; it also takes systemd's socket activation.
LDLIBS_sil-openai := $(shell pkg-config --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd) \
	$(LDLIBS_DAEMON) -lpthread

AVX2_FLAGS := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c

KERNEL_SRC := $(wildcard kernels/*.c kernels/cpu/*.c)
ENGINE_SRC := $(wildcard daemon/engine/*.c)
PROTO_SRC := $(wildcard libproto/*.c)
DAEMON_SRC := $(filter-out daemon/main.c,$(wildcard daemon/*.c))
CLIENT_COMMON_SRC := $(wildcard client/common/*.c)
BENCH_COMMON_SRC := $(wildcard bench/common/*.c)
# sil-mkmodel's pieces are also a library, so tests and fuzzers link them instead of including .c files.
MKMODEL_SRC := $(wildcard bench/sil-mkmodel/*.c)
CLIENTS := $(patsubst client/%.c,%,$(wildcard client/sil-*.c))
BENCHES := $(patsubst bench/%.c,%,$(wildcard bench/sil-*.c))
TESTS := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
TESTUTIL_SRC := $(wildcard tests/testutil*.c)
FUZZERS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

obj = $(patsubst %.c,$(B)/obj/%.o,$(1))
fobj = $(patsubst %.c,$(B)/fuzzobj/%.o,$(1))

LIB_KERNELS := $(B)/lib/libsil-kernels.a
LIB_ENGINE := $(B)/lib/libsil-engine.a
LIB_PROTO := $(B)/lib/libsiliceo-proto.a
LIB_DAEMON := $(B)/lib/libsil-daemon.a
LIB_CLIENT := $(B)/lib/libsil-client.a
LIB_BENCH := $(B)/lib/libsil-bench.a
LIB_MKMODEL := $(B)/lib/libsil-mkmodel.a
LIB_OPENAI := $(B)/lib/libsil-openai.a

# CUDA: the kernels are one translation unit (kernels/cuda/kernels.cu includes the rest), built into
# one fatbin of SASS for every listed architecture plus compute_75 PTX, which newer GPUs JIT.
CUDA_ARCHS ?= 75 86 89 90
CUDA_PTX_ARCH ?= 75
NVCC_FLAGS ?= -O3
CUDA_CU := $(wildcard kernels/cuda/*.cu kernels/cuda/*.cuh)
CUDA_HOST_SRC := $(if $(filter 1,$(CUDA)),$(wildcard kernels/cuda/*.c))
NVCC_ALL = -std=c++17 --fatbin -I. -Werror all-warnings $(NVCC_FLAGS) \
	$(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
	-gencode arch=compute_$(CUDA_PTX_ARCH),code=compute_$(CUDA_PTX_ARCH)
LIB_CUDA := $(if $(CUDA_HOST_SRC),$(B)/lib/libsil-cuda.a)
CUDA_FATBIN_OBJ := $(B)/obj/kernels/cuda/fatbin.o
ifeq ($(CUDA),1)
BASE_CFLAGS += -DSIL_HAVE_CUDA=1 -DSIL_CUDA_ARCHS="\"$(strip $(foreach a,$(CUDA_ARCHS),sm_$(a)) compute_$(CUDA_PTX_ARCH))\""
CUDA_TESTS := $(filter test_cuda_%,$(TESTS))
CUDA_BENCHES := $(filter sil-cuda%,$(BENCHES))
else
TESTS := $(filter-out test_cuda_%,$(TESTS))
BENCHES := $(filter-out sil-cuda%,$(BENCHES))
endif

BINS := $(if $(wildcard daemon/main.c),$(B)/bin/siliceod) $(addprefix $(B)/bin/,$(CLIENTS) $(BENCHES))
TEST_BINS := $(addprefix $(B)/tests/,$(TESTS))
FUZZ_BINS := $(addprefix $(B)/fuzz/,$(FUZZERS))

.PHONY: all check check-unit check-integration check-fuzz check-mandoc check-asan \
	check-asan-integration check-tsan check-cuda fuzz deps deps-train demo demo-random install install-service uninstall deb clean \
	format tests
.DEFAULT_GOAL := all

all: $(BINS) $(LIB_PROTO) $(B)/siliceo-proto.pc

# ---- objects -------------------------------------------------------------------------------------
# The object rules of one build flavour: $(1) object dir, $(2) compiler, $(3) flags (both passed
# as $$(NAME) so they expand when the recipe runs).
define object_rules
$(1)/%_avx2.o: %_avx2.c
	@mkdir -p $$(dir $$@)
	$(2) $(3) $$(AVX2_FLAGS) -c $$< -o $$@
$(1)/%_avx512.o: %_avx512.c
	@mkdir -p $$(dir $$@)
	$(2) $(3) $$(AVX512_FLAGS) -c $$< -o $$@
$(1)/%.o: %.c
	@mkdir -p $$(dir $$@)
	$(2) $(3) -c $$< -o $$@
endef
$(eval $(call object_rules,$(B)/obj,$$(CC),$$(ALL_CFLAGS)))

FUZZ_CFLAGS := $(BASE_CFLAGS) -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
$(eval $(call object_rules,$(B)/fuzzobj,$$(FUZZ_CC),$$(FUZZ_CFLAGS)))

# ---- libraries -----------------------------------------------------------------------------------
define static_lib
$(1): $(2)
	@mkdir -p $$(dir $$@)
	rm -f $$@
	$$(if $$^,ar rcs $$@ $$^,ar rcs $$@)
endef
$(eval $(call static_lib,$(LIB_KERNELS),$(call obj,$(KERNEL_SRC))))
$(eval $(call static_lib,$(LIB_ENGINE),$(call obj,$(ENGINE_SRC))))
$(eval $(call static_lib,$(LIB_PROTO),$(call obj,$(PROTO_SRC))))
$(eval $(call static_lib,$(LIB_DAEMON),$(call obj,$(DAEMON_SRC))))
$(eval $(call static_lib,$(LIB_CLIENT),$(call obj,$(CLIENT_COMMON_SRC))))
$(eval $(call static_lib,$(LIB_BENCH),$(call obj,$(BENCH_COMMON_SRC))))
$(eval $(call static_lib,$(LIB_MKMODEL),$(call obj,$(MKMODEL_SRC))))
# sil-openai's HTTP-free pieces (JSON, request mapping), for tests/test_openai.c.
OPENAI_SRC := $(wildcard client/sil-openai/*.c)
$(eval $(call static_lib,$(LIB_OPENAI),$(call obj,$(OPENAI_SRC))))

ENGINE_LIBS := $(LIB_ENGINE) $(LIB_CUDA) $(LIB_KERNELS)
ALL_LIBS := $(LIB_DAEMON) $(LIB_MKMODEL) $(LIB_OPENAI) $(LIB_ENGINE) $(LIB_CUDA) $(LIB_KERNELS) $(LIB_CLIENT) $(LIB_PROTO)

# The fatbin is embedded with .incbin: nothing beyond the compiler and nvcc is needed.
$(B)/cuda/kernels.fatbin: kernels/cuda/kernels.cu $(CUDA_CU)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_ALL) -o $@ $<
$(B)/cuda/fatbin.S: $(B)/cuda/kernels.fatbin
	printf '%s\n' '.section .rodata' '.balign 64' '.globl sil_cuda_fatbin' \
		'.type sil_cuda_fatbin, @object' 'sil_cuda_fatbin:' '.incbin "$<"' 'sil_cuda_fatbin_end:' \
		'.size sil_cuda_fatbin, sil_cuda_fatbin_end - sil_cuda_fatbin' '.balign 8' \
		'.globl sil_cuda_fatbin_size' '.type sil_cuda_fatbin_size, @object' 'sil_cuda_fatbin_size:' \
		'.quad sil_cuda_fatbin_end - sil_cuda_fatbin' '.size sil_cuda_fatbin_size, 8' \
		'.section .note.GNU-stack,"",@progbits' > $@
$(CUDA_FATBIN_OBJ): $(B)/cuda/fatbin.S
	@mkdir -p $(dir $@)
	$(CC) -c $< -o $@
# Further modules, each embedded the same way as sil_cuda_NAME_fatbin: the engine's forward-pass
# kernels (fwd.cu) and sil-cudabench's measurement kernels (chain.cu).
define module_fatbin
$(B)/cuda/$(1).fatbin: kernels/cuda/$(1).cu $(CUDA_CU)
	@mkdir -p $$(dir $$@)
	$(NVCC) $(NVCC_ALL) -o $$@ $$<
$(B)/cuda/$(1)_fatbin.S: $(B)/cuda/$(1).fatbin
	printf '%s\n' '.section .rodata' '.balign 64' '.globl sil_cuda_$(1)_fatbin' \
		'.type sil_cuda_$(1)_fatbin, @object' 'sil_cuda_$(1)_fatbin:' '.incbin "$$<"' \
		'sil_cuda_$(1)_fatbin_end:' '.size sil_cuda_$(1)_fatbin, sil_cuda_$(1)_fatbin_end - sil_cuda_$(1)_fatbin' \
		'.section .note.GNU-stack,"",@progbits' > $$@
$(B)/obj/kernels/cuda/$(1)_fatbin.o: $(B)/cuda/$(1)_fatbin.S
	@mkdir -p $$(dir $$@)
	$(CC) -c $$< -o $$@
endef
$(eval $(call module_fatbin,fwd))
$(eval $(call module_fatbin,chain))
CUDA_FWD_FATBIN_OBJ := $(B)/obj/kernels/cuda/fwd_fatbin.o
CUDA_CHAIN_FATBIN_OBJ := $(B)/obj/kernels/cuda/chain_fatbin.o
ifneq ($(LIB_CUDA),)
$(eval $(call static_lib,$(LIB_CUDA),$(call obj,$(CUDA_HOST_SRC)) $(CUDA_FATBIN_OBJ) $(CUDA_FWD_FATBIN_OBJ) $(CUDA_CHAIN_FATBIN_OBJ)))
endif
ALL_LDLIBS := $(LDLIBS_DAEMON) $(LDLIBS_PROTO) $(LDLIBS_ENGINE) $(LDLIBS_EDIT)

# The .pc names the install directories: `make install PREFIX=...` writes it again with those.
PC_SED = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	-e 's|@VERSION@|$(VERSION)|g' libproto/siliceo-proto.pc.in
$(B)/siliceo-proto.pc: libproto/siliceo-proto.pc.in Makefile
	@mkdir -p $(dir $@)
	$(PC_SED) > $@

# ---- binaries ------------------------------------------------------------------------------------
$(B)/bin/siliceod: $(call obj,daemon/main.c) $(LIB_DAEMON) $(ENGINE_LIBS) $(LIB_PROTO)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS_DAEMON) $(LDLIBS_PROTO) $(LDLIBS_ENGINE)

define client_bin
$(B)/bin/$(1): $(call obj,client/$(1).c $(wildcard client/$(1)/*.c)) $(LIB_CLIENT) $(LIB_PROTO)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -o $$@ $$^ $$(LDLIBS_PROTO) $$(LDLIBS_EDIT) $$(LDLIBS_$(1)) -lm
endef
$(foreach c,$(CLIENTS),$(eval $(call client_bin,$(c))))

define bench_bin
$(B)/bin/$(1): $(call obj,bench/$(1).c $(wildcard bench/$(1)/*.c)) $(LIB_BENCH) $(ENGINE_LIBS)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -o $$@ $$^ $$(LDLIBS_ENGINE)
endef
$(foreach b,$(filter-out $(CUDA_BENCHES),$(BENCHES)),$(eval $(call bench_bin,$(b))))

define test_bin
$(B)/tests/$(1): $(call obj,tests/$(1).c $(TESTUTIL_SRC)) $(ALL_LIBS)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -o $$@ $$(call obj,tests/$(1).c $(TESTUTIL_SRC)) $(ALL_LIBS) -lcmocka $(ALL_LDLIBS)
endef
$(foreach t,$(filter-out $(CUDA_TESTS),$(TESTS)),$(eval $(call test_bin,$(t))))

# The CUDA test and benchmark link only the kernels, so check-cuda builds on a GPU machine that
# has a compiler and nvcc but none of the daemon's libraries.
define cuda_bin
$(2)/$(1): $(call $(3),$(4)) $(5)
	@mkdir -p $$(dir $$@)
	$$($(6)) $$($(7)) -o $$@ $$^ -ldl -lm -lpthread
endef
$(foreach t,$(CUDA_TESTS),$(eval $(call cuda_bin,$(t),$(B)/tests,obj,tests/$(t).c,$(LIB_CUDA) $(LIB_KERNELS),CC,CFLAGS)))
$(foreach b,$(CUDA_BENCHES),$(eval $(call cuda_bin,$(b),$(B)/bin,obj,bench/$(b).c,$(LIB_CUDA) $(LIB_KERNELS),CC,CFLAGS)))

# the engine calls the CUDA backend when built with it; client/sil-openai/*.c holds no HTTP code:
# its request parser is a fuzz target.
FUZZ_LIB_OBJS := $(call fobj,$(KERNEL_SRC) $(ENGINE_SRC) $(PROTO_SRC) $(DAEMON_SRC) $(MKMODEL_SRC) \
	$(OPENAI_SRC))
FUZZ_LIB_OBJS += $(call fobj,$(CUDA_HOST_SRC)) $(if $(CUDA_HOST_SRC),$(CUDA_FATBIN_OBJ) $(CUDA_FWD_FATBIN_OBJ) $(CUDA_CHAIN_FATBIN_OBJ))
define fuzz_bin
$(B)/fuzz/$(1): $(call fobj,tests/fuzz/$(1).c) $(FUZZ_LIB_OBJS)
	@mkdir -p $$(dir $$@)
	$$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $$@ $$^ $(ALL_LDLIBS)
endef
$(foreach f,$(FUZZERS),$(eval $(call fuzz_bin,$(f))))

tests: $(TEST_BINS)

# ---- ASan + UBSan build of the unit tests (and of the binaries they run) under $(B)/asan --------
# Same sources, own objects; the tree mirrors $(B) (tests/, bin/): `tests/run-all.sh asan` runs it.
ASAN_CC ?= $(if $(shell command -v clang 2>/dev/null),clang,$(CC))
ASAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_CFLAGS := $(BASE_CFLAGS) $(ASAN_FLAGS)
ASAN_B := $(B)/asan
aobj = $(patsubst %.c,$(ASAN_B)/obj/%.o,$(1))

$(eval $(call object_rules,$(ASAN_B)/obj,$$(ASAN_CC),$$(ASAN_CFLAGS)))

A_LIB_KERNELS := $(ASAN_B)/lib/libsil-kernels.a
A_LIB_ENGINE := $(ASAN_B)/lib/libsil-engine.a
A_LIB_PROTO := $(ASAN_B)/lib/libsiliceo-proto.a
A_LIB_DAEMON := $(ASAN_B)/lib/libsil-daemon.a
A_LIB_CLIENT := $(ASAN_B)/lib/libsil-client.a
A_LIB_BENCH := $(ASAN_B)/lib/libsil-bench.a
A_LIB_MKMODEL := $(ASAN_B)/lib/libsil-mkmodel.a
A_LIB_OPENAI := $(ASAN_B)/lib/libsil-openai.a
$(eval $(call static_lib,$(A_LIB_KERNELS),$(call aobj,$(KERNEL_SRC))))
$(eval $(call static_lib,$(A_LIB_ENGINE),$(call aobj,$(ENGINE_SRC))))
$(eval $(call static_lib,$(A_LIB_PROTO),$(call aobj,$(PROTO_SRC))))
$(eval $(call static_lib,$(A_LIB_DAEMON),$(call aobj,$(DAEMON_SRC))))
$(eval $(call static_lib,$(A_LIB_CLIENT),$(call aobj,$(CLIENT_COMMON_SRC))))
$(eval $(call static_lib,$(A_LIB_BENCH),$(call aobj,$(BENCH_COMMON_SRC))))
$(eval $(call static_lib,$(A_LIB_MKMODEL),$(call aobj,$(MKMODEL_SRC))))
$(eval $(call static_lib,$(A_LIB_OPENAI),$(call aobj,$(OPENAI_SRC))))
A_LIB_CUDA := $(if $(CUDA_HOST_SRC),$(ASAN_B)/lib/libsil-cuda.a)
ifneq ($(A_LIB_CUDA),)
$(eval $(call static_lib,$(A_LIB_CUDA),$(call aobj,$(CUDA_HOST_SRC)) $(CUDA_FATBIN_OBJ) $(CUDA_FWD_FATBIN_OBJ) $(CUDA_CHAIN_FATBIN_OBJ)))
endif
A_ALL_LIBS := $(A_LIB_DAEMON) $(A_LIB_MKMODEL) $(A_LIB_OPENAI) $(A_LIB_ENGINE) $(A_LIB_CUDA) $(A_LIB_KERNELS) $(A_LIB_CLIENT) $(A_LIB_PROTO)

define asan_test_bin
$(ASAN_B)/tests/$(1): $(call aobj,tests/$(1).c $(TESTUTIL_SRC)) $(A_ALL_LIBS)
	@mkdir -p $$(dir $$@)
	$$(ASAN_CC) $$(ASAN_FLAGS) -o $$@ $$(call aobj,tests/$(1).c $(TESTUTIL_SRC)) $(A_ALL_LIBS) -lcmocka $(ALL_LDLIBS)
endef
$(foreach t,$(filter-out $(CUDA_TESTS),$(TESTS)),$(eval $(call asan_test_bin,$(t))))
$(foreach t,$(CUDA_TESTS),$(eval $(call cuda_bin,$(t),$(ASAN_B)/tests,aobj,tests/$(t).c,$(A_LIB_CUDA) $(A_LIB_KERNELS),ASAN_CC,ASAN_FLAGS)))

# Tests start some client and bench binaries (sil-chat, sil-mkmodel): those are sanitized too.
define asan_client_bin
$(ASAN_B)/bin/$(1): $(call aobj,client/$(1).c $(wildcard client/$(1)/*.c)) $(A_LIB_CLIENT) $(A_LIB_PROTO)
	@mkdir -p $$(dir $$@)
	$$(ASAN_CC) $$(ASAN_FLAGS) -o $$@ $$^ $$(LDLIBS_PROTO) $$(LDLIBS_EDIT) $$(LDLIBS_$(1)) -lm
endef
$(foreach c,$(CLIENTS),$(eval $(call asan_client_bin,$(c))))
define asan_bench_bin
$(ASAN_B)/bin/$(1): $(call aobj,bench/$(1).c $(wildcard bench/$(1)/*.c)) $(A_LIB_BENCH) $(A_LIB_ENGINE) $(A_LIB_CUDA) $(A_LIB_KERNELS)
	@mkdir -p $$(dir $$@)
	$$(ASAN_CC) $$(ASAN_FLAGS) -o $$@ $$^ $$(LDLIBS_ENGINE)
endef
$(foreach b,$(filter-out $(CUDA_BENCHES),$(BENCHES)),$(eval $(call asan_bench_bin,$(b))))
$(foreach b,$(CUDA_BENCHES),$(eval $(call cuda_bin,$(b),$(ASAN_B)/bin,aobj,bench/$(b).c,$(A_LIB_CUDA) $(A_LIB_KERNELS),ASAN_CC,ASAN_FLAGS)))

ASAN_TEST_BINS := $(addprefix $(ASAN_B)/tests/,$(TESTS))
ASAN_BINS := $(addprefix $(ASAN_B)/bin/,$(CLIENTS) $(BENCHES))

# The sanitized daemon, for check-asan-integration.
$(ASAN_B)/bin/siliceod: $(call aobj,daemon/main.c) $(A_LIB_DAEMON) $(A_LIB_ENGINE) $(A_LIB_CUDA) $(A_LIB_KERNELS) $(A_LIB_PROTO)
	@mkdir -p $(dir $@)
	$(ASAN_CC) $(ASAN_FLAGS) -o $@ $^ $(LDLIBS_DAEMON) $(LDLIBS_PROTO) $(LDLIBS_ENGINE)
ifneq ($(wildcard daemon/main.c),)
ASAN_BINS += $(ASAN_B)/bin/siliceod
endif

# ---- ThreadSanitizer build of the daemon and the tools its tests start, under $(B)/tsan --------
# For check-tsan: the daemon's integration tests with every data race a failure.
TSAN_CC ?= $(if $(shell command -v clang 2>/dev/null),clang,$(CC))
TSAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=thread
TSAN_CFLAGS := $(BASE_CFLAGS) $(TSAN_FLAGS)
TSAN_B := $(B)/tsan
tobj = $(patsubst %.c,$(TSAN_B)/obj/%.o,$(1))

$(eval $(call object_rules,$(TSAN_B)/obj,$$(TSAN_CC),$$(TSAN_CFLAGS)))

T_LIB_KERNELS := $(TSAN_B)/lib/libsil-kernels.a
T_LIB_ENGINE := $(TSAN_B)/lib/libsil-engine.a
T_LIB_PROTO := $(TSAN_B)/lib/libsiliceo-proto.a
T_LIB_DAEMON := $(TSAN_B)/lib/libsil-daemon.a
T_LIB_CLIENT := $(TSAN_B)/lib/libsil-client.a
T_LIB_BENCH := $(TSAN_B)/lib/libsil-bench.a
$(eval $(call static_lib,$(T_LIB_KERNELS),$(call tobj,$(KERNEL_SRC))))
$(eval $(call static_lib,$(T_LIB_ENGINE),$(call tobj,$(ENGINE_SRC))))
$(eval $(call static_lib,$(T_LIB_PROTO),$(call tobj,$(PROTO_SRC))))
$(eval $(call static_lib,$(T_LIB_DAEMON),$(call tobj,$(DAEMON_SRC))))
$(eval $(call static_lib,$(T_LIB_CLIENT),$(call tobj,$(CLIENT_COMMON_SRC))))
$(eval $(call static_lib,$(T_LIB_BENCH),$(call tobj,$(BENCH_COMMON_SRC))))
T_LIB_CUDA := $(if $(CUDA_HOST_SRC),$(TSAN_B)/lib/libsil-cuda.a)
ifneq ($(T_LIB_CUDA),)
$(eval $(call static_lib,$(T_LIB_CUDA),$(call tobj,$(CUDA_HOST_SRC)) $(CUDA_FATBIN_OBJ) $(CUDA_FWD_FATBIN_OBJ) $(CUDA_CHAIN_FATBIN_OBJ)))
endif

define tsan_client_bin
$(TSAN_B)/bin/$(1): $(call tobj,client/$(1).c $(wildcard client/$(1)/*.c)) $(T_LIB_CLIENT) $(T_LIB_PROTO)
	@mkdir -p $$(dir $$@)
	$$(TSAN_CC) $$(TSAN_FLAGS) -o $$@ $$^ $$(LDLIBS_PROTO) $$(LDLIBS_EDIT) $$(LDLIBS_$(1)) -lm
endef
$(foreach c,$(CLIENTS),$(eval $(call tsan_client_bin,$(c))))
define tsan_bench_bin
$(TSAN_B)/bin/$(1): $(call tobj,bench/$(1).c $(wildcard bench/$(1)/*.c)) $(T_LIB_BENCH) $(T_LIB_ENGINE) $(T_LIB_CUDA) $(T_LIB_KERNELS)
	@mkdir -p $$(dir $$@)
	$$(TSAN_CC) $$(TSAN_FLAGS) -o $$@ $$^ $$(LDLIBS_ENGINE)
endef
$(foreach b,$(BENCHES),$(eval $(call tsan_bench_bin,$(b))))
$(TSAN_B)/bin/siliceod: $(call tobj,daemon/main.c) $(T_LIB_DAEMON) $(T_LIB_ENGINE) $(T_LIB_CUDA) $(T_LIB_KERNELS) $(T_LIB_PROTO)
	@mkdir -p $(dir $@)
	$(TSAN_CC) $(TSAN_FLAGS) -o $@ $^ $(LDLIBS_DAEMON) $(LDLIBS_PROTO) $(LDLIBS_ENGINE)
TSAN_BINS := $(addprefix $(TSAN_B)/bin/,$(CLIENTS) $(BENCHES))
ifneq ($(wildcard daemon/main.c),)
TSAN_BINS += $(TSAN_B)/bin/siliceod
endif

# page.c embeds the chat page's files with .incbin, which the compiler's dependency files do not list.
$(foreach d,$(B)/obj $(B)/fuzzobj $(ASAN_B)/obj $(TSAN_B)/obj,$(d)/client/sil-openai/page.o): \
	client/sil-openai/chat.html client/sil-openai/chat.css client/sil-openai/chat.js

# ---- tests ---------------------------------------------------------------------------------------
SHARED ?= $(abspath ../shared)
FUZZ_SECONDS ?= 300
CHECK_FUZZ_SECONDS ?= 30

check: all tests $(FUZZ_BINS) $(ASAN_TEST_BINS) $(ASAN_BINS)
	@SHARED=$(SHARED) B=$(B) ASAN_B=$(ASAN_B) CHECK_FUZZ_SECONDS=$(CHECK_FUZZ_SECONDS) tests/run-all.sh

check-unit: all tests
	@SHARED=$(SHARED) B=$(B) tests/run-all.sh unit

check-integration: all
	@SHARED=$(SHARED) B=$(B) tests/run-all.sh integration

check-fuzz: $(FUZZ_BINS)
	@SHARED=$(SHARED) B=$(B) CHECK_FUZZ_SECONDS=$(CHECK_FUZZ_SECONDS) tests/run-all.sh fuzz

check-asan: $(ASAN_TEST_BINS) $(ASAN_BINS)
	@SHARED=$(SHARED) B=$(B) ASAN_B=$(ASAN_B) tests/run-all.sh asan

# Not part of check: about 80 s more on 2 cores, and the timing tests (daemon_watchdog) run
# several times slower under the sanitizers.
check-asan-integration: $(ASAN_BINS)
	@SHARED=$(SHARED) B=$(B) ASAN_B=$(ASAN_B) tests/run-all.sh asan-integration

# The daemon's integration tests against the ThreadSanitizer build (tests/tsan.supp says what
# is suppressed and why); a report stops the daemon and fails the test. Run by .ci/run.
check-tsan: all $(TSAN_BINS)
	@SHARED=$(SHARED) B=$(B) TSAN_B=$(TSAN_B) tests/run-all.sh tsan-integration

check-mandoc:
	@SHARED=$(SHARED) B=$(B) tests/run-all.sh mandoc

fuzz: $(FUZZ_BINS)
	@SHARED=$(SHARED) B=$(B) CHECK_FUZZ_SECONDS=$(FUZZ_SECONDS) tests/run-all.sh fuzz

# On a GPU machine: SIL_CUDA_REQUIRE=1 turns "no GPU" from a skip into a failure.
# compute-sanitizer's memcheck runs the whole test again where it is installed; API errors are
# not reported because the test provokes one (a failed 1 PiB allocation) on purpose.
COMPUTE_SANITIZER ?= $(shell command -v compute-sanitizer 2>/dev/null)
ifeq ($(CUDA),1)
# Whole-model parity (CUDA vs CPU backend on every reference model) links the engine.
REFDATA_MODELS ?= $(SHARED)/refdata/models
$(B)/tests/cuda_fwd_parity: $(call obj,tests/cuda_fwd_parity.c tests/testutil.c) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS_ENGINE)
check-cuda: $(B)/tests/test_cuda_ops $(B)/tests/test_cuda_mmq $(B)/tests/cuda_fwd_parity \
	$(B)/bin/sil-mkmodel $(B)/bin/sil-eval
	SIL_CUDA_REQUIRE=1 $(B)/tests/test_cuda_ops
	SIL_CUDA_REQUIRE=1 CUDA_FORCE_PTX_JIT=1 $(B)/tests/test_cuda_ops
	SIL_CUDA_REQUIRE=1 $(B)/tests/test_cuda_mmq
	SIL_CUDA_REQUIRE=1 CUDA_FORCE_PTX_JIT=1 $(B)/tests/test_cuda_mmq
	$(if $(COMPUTE_SANITIZER),SIL_CUDA_REQUIRE=1 $(COMPUTE_SANITIZER) --tool memcheck --report-api-errors no \
		--error-exitcode 9 $(B)/tests/test_cuda_ops,@echo "check-cuda: no compute-sanitizer; memcheck skipped")
	$(if $(COMPUTE_SANITIZER),SIL_CUDA_REQUIRE=1 $(COMPUTE_SANITIZER) --tool racecheck --error-exitcode 9 \
		$(B)/tests/test_cuda_ops,@echo "check-cuda: no compute-sanitizer; racecheck skipped")
	SIL_CUDA_REQUIRE=1 tests/cuda-fwd.sh $(B)/tests/cuda_fwd_parity $(REFDATA_MODELS)
	SIL_CUDA_REQUIRE=1 tests/cuda-fwd-shared.sh $(B)
	@# the whole model once more through the PTX JIT and under memcheck (graphs, routing, attention);
	@# the JIT takes about a minute an engine, so there checks 1-6 (SIL_TEST_CORE=1: two engines)
	rm -rf $(B)/cuda-one && mkdir -p $(B)/cuda-one && \
		cp $(REFDATA_MODELS)/qwen35moe-tiny-Q4_K_M.* $(B)/cuda-one/
	SIL_CUDA_REQUIRE=1 SIL_TEST_CORE=1 CUDA_FORCE_PTX_JIT=1 \
		tests/cuda-fwd.sh $(B)/tests/cuda_fwd_parity $(B)/cuda-one
	$(if $(COMPUTE_SANITIZER),SIL_CUDA_REQUIRE=1 $(COMPUTE_SANITIZER) --target-processes all --tool memcheck \
		--report-api-errors no --error-exitcode 9 tests/cuda-fwd.sh $(B)/tests/cuda_fwd_parity $(B)/cuda-one,\
		@echo "check-cuda: no compute-sanitizer; whole-model memcheck skipped")
	@# racecheck over the whole model's kernels (attention, delta net, MoE in graphs), checks 1-6
	$(if $(COMPUTE_SANITIZER),SIL_CUDA_REQUIRE=1 SIL_TEST_CORE=1 $(COMPUTE_SANITIZER) --target-processes all \
		--tool racecheck --error-exitcode 9 tests/cuda-fwd.sh $(B)/tests/cuda_fwd_parity $(B)/cuda-one,\
		@echo "check-cuda: no compute-sanitizer; whole-model racecheck skipped")
else
check-cuda:
	@echo "check-cuda: built with CUDA=0 (no nvcc); nothing to check" && false
endif

# ---- demo ----------------------------------------------------------------------------------------
demo: all
	@B=$(B) contrib/demo.sh

demo-random: all
	@B=$(B) contrib/demo.sh --random

# ---- dependencies --------------------------------------------------------------------------------
DEB_PACKAGES := build-essential pkgconf libmsgpack-dev libsystemd-dev libcmocka-dev libpcre2-dev \
	libedit-dev mandoc clang libclang-rt-14-dev gnuplot-nox python3 systemd procps \
	debhelper dpkg-dev lintian git strace \
	python3-prometheus-client tmux \
	libmicrohttpd-dev curl python3-torch neovim chromium
# The official openai JavaScript SDK, for tests/integration/openai.sh only: installed into the
# build tree (git-ignored), never committed or linked. 4.104.0 runs on Node.js 18 and 20.
NPM_TEST_PACKAGES := openai@4.104.0
# What bench/train needs beyond the parity test's PyTorch: the loss-curve plot.
TRAIN_DEB_PACKAGES := python3-torch python3-numpy python3-matplotlib
deps:
	@if dpkg -s $(DEB_PACKAGES) >/dev/null 2>&1; then echo "deps: all packages present"; \
	else apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(DEB_PACKAGES); fi
	@if ! command -v npm >/dev/null; then echo "deps: no npm: the openai SDK test will be skipped"; \
	elif [ -f $(B)/npm/node_modules/openai/package.json ]; then echo "deps: openai SDK present"; \
	else mkdir -p $(B)/npm && npm install --prefix $(B)/npm --no-audit --no-fund $(NPM_TEST_PACKAGES); fi

deps-train:
	@if dpkg -s $(TRAIN_DEB_PACKAGES) >/dev/null 2>&1; then echo "deps-train: all packages present"; \
	else apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(TRAIN_DEB_PACKAGES); fi

# ---- install -------------------------------------------------------------------------------------
COMPLETIONS := $(notdir $(wildcard contrib/bash-completion/*))
NVIM_FILES := $(patsubst contrib/nvim/%,%,$(shell find contrib/nvim -type f 2>/dev/null))
UNIT_SED = sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g'

# Each $(foreach) line is one shell command: set -e makes a failed install in its middle fail it,
# and so make, instead of leaving only the last command's status.
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
		$(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 \
		$(DESTDIR)$(MANDIR)/man7 $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(BASHCOMPDIR) \
		$(DESTDIR)$(DATADIR)/siliceo
	$(if $(wildcard daemon/main.c),install -m 755 $(B)/bin/siliceod $(DESTDIR)$(SBINDIR)/)
	set -e; $(foreach b,$(CLIENTS) $(BENCHES),install -m 755 $(B)/bin/$(b) $(DESTDIR)$(BINDIR)/;)
	install -m 644 $(LIB_PROTO) $(DESTDIR)$(LIBDIR)/
	install -m 644 libproto/siliceo-proto.h $(DESTDIR)$(INCLUDEDIR)/
	$(PC_SED) > $(DESTDIR)$(LIBDIR)/pkgconfig/siliceo-proto.pc
	chmod 644 $(DESTDIR)$(LIBDIR)/pkgconfig/siliceo-proto.pc
	set -e; $(foreach s,1 5 7 8,$(foreach m,$(wildcard man/*.$(s)),install -m 644 $(m) $(DESTDIR)$(MANDIR)/man$(s)/;))
	set -e; $(foreach c,$(COMPLETIONS),install -m 644 contrib/bash-completion/$(c) $(DESTDIR)$(BASHCOMPDIR)/;)
	install -m 755 contrib/siliceo-probe.sh $(DESTDIR)$(DATADIR)/siliceo/
	set -e; $(foreach f,$(NVIM_FILES),install -D -m 644 contrib/nvim/$(f) $(DESTDIR)$(NVIMDIR)/$(f);)

# The service files. An existing configuration is kept (a new one beside it as .dist); without
# DESTDIR the user, group and directories are created at once and systemd re-reads its units.
install-service: install
	install -d $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) \
		$(DESTDIR)$(SYSCONFDIR)/siliceo
	$(UNIT_SED) contrib/systemd/siliceod.service.in > $(DESTDIR)$(SYSTEMDUNITDIR)/siliceod.service
	$(UNIT_SED) contrib/systemd/sil-openai.service.in > $(DESTDIR)$(SYSTEMDUNITDIR)/sil-openai.service
	chmod 644 $(DESTDIR)$(SYSTEMDUNITDIR)/siliceod.service $(DESTDIR)$(SYSTEMDUNITDIR)/sil-openai.service
	install -m 644 contrib/systemd/siliceod.socket contrib/systemd/sil-openai.socket \
		$(DESTDIR)$(SYSTEMDUNITDIR)/
	install -m 644 contrib/sysusers/siliceo.conf $(DESTDIR)$(SYSUSERSDIR)/
	install -m 644 contrib/tmpfiles/siliceo.conf $(DESTDIR)$(TMPFILESDIR)/
	if [ -e $(DESTDIR)$(SYSCONFDIR)/siliceo/siliceod.conf ]; then \
		install -m 644 contrib/siliceod.conf $(DESTDIR)$(SYSCONFDIR)/siliceo/siliceod.conf.dist; \
		echo "kept $(DESTDIR)$(SYSCONFDIR)/siliceo/siliceod.conf; the shipped one is siliceod.conf.dist"; \
	else install -m 644 contrib/siliceod.conf $(DESTDIR)$(SYSCONFDIR)/siliceo/; fi
	$(if $(DESTDIR),,systemd-sysusers $(SYSUSERSDIR)/siliceo.conf)
	$(if $(DESTDIR),,systemd-tmpfiles --create $(TMPFILESDIR)/siliceo.conf)
	$(if $(DESTDIR),,-systemctl daemon-reload)

# The configuration stays when it differs from the shipped one (it was edited).
uninstall:
	rm -f $(DESTDIR)$(SBINDIR)/siliceod $(addprefix $(DESTDIR)$(BINDIR)/,$(CLIENTS) $(BENCHES)) \
		$(DESTDIR)$(LIBDIR)/libsiliceo-proto.a $(DESTDIR)$(INCLUDEDIR)/siliceo-proto.h \
		$(DESTDIR)$(LIBDIR)/pkgconfig/siliceo-proto.pc \
		$(foreach s,1 5 7 8,$(patsubst man/%,$(DESTDIR)$(MANDIR)/man$(s)/%,$(wildcard man/*.$(s)))) \
		$(addprefix $(DESTDIR)$(BASHCOMPDIR)/,$(COMPLETIONS)) \
		$(DESTDIR)$(DATADIR)/siliceo/siliceo-probe.sh \
		$(DESTDIR)$(SYSTEMDUNITDIR)/siliceod.service $(DESTDIR)$(SYSTEMDUNITDIR)/siliceod.socket \
		$(DESTDIR)$(SYSTEMDUNITDIR)/sil-openai.service $(DESTDIR)$(SYSTEMDUNITDIR)/sil-openai.socket \
		$(DESTDIR)$(SYSUSERSDIR)/siliceo.conf $(DESTDIR)$(TMPFILESDIR)/siliceo.conf \
		$(DESTDIR)$(SYSCONFDIR)/siliceo/siliceod.conf.dist
	rm -rf $(DESTDIR)$(NVIMDIR)
	-rmdir $(DESTDIR)$(DATADIR)/siliceo $(dir $(DESTDIR)$(NVIMDIR)) $(DESTDIR)$(DATADIR)/nvim/site/pack/siliceo 2>/dev/null
	if cmp -s contrib/siliceod.conf $(DESTDIR)$(SYSCONFDIR)/siliceo/siliceod.conf; then \
		rm -f $(DESTDIR)$(SYSCONFDIR)/siliceo/siliceod.conf; \
		rmdir $(DESTDIR)$(SYSCONFDIR)/siliceo 2>/dev/null || true; fi

# ---- Debian packages -----------------------------------------------------------------------------
# dpkg-buildpackage in a copy of the tree's files that git tracks or would track (it writes debian/ and ../*.deb); the packages
# and the build log land in $(B)/deb/.
deb:
	rm -rf $(B)/deb && mkdir -p $(B)/deb/src
	git ls-files -z --cached --others --exclude-standard | \
		xargs -0 sh -c 'for f; do [ ! -e "$$f" ] || cp --parents "$$f" "$$0"; done' $(B)/deb/src
	cd $(B)/deb/src && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
		dpkg-buildpackage -us -uc -b -j2 >../build.log 2>&1 || { tail -n 40 ../build.log; exit 1; }
	lintian $(B)/deb/*.changes >$(B)/deb/lintian.log 2>&1 || { cat $(B)/deb/lintian.log; exit 1; }
	cat $(B)/deb/lintian.log
	ls $(B)/deb/*.deb

clean:
	rm -rf $(B)

format:
	clang-format -i $(wildcard kernels/*.[ch] kernels/cpu/*.[ch] kernels/cuda/*.[ch] daemon/*.[ch] daemon/engine/*.[ch] libproto/*.[ch] \
		client/*.[ch] client/*/*.[ch] bench/*.[ch] bench/*/*.[ch] tests/*.[ch] tests/fuzz/*.[ch])

-include $(shell find $(B) -name '*.d' -type f 2>/dev/null)
