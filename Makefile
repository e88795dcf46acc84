# siliceo — one top-level Makefile. Objects go under build/, never into the tree.
#
#   make            all binaries and libraries
#   make check      every test that needs no GPU (units, the units again under ASan + UBSan,
#                   parity, integration, short fuzz)
#   make check-asan only the unit tests built with ASan + UBSan (-O1, objects under build/asan/)
#   make check-asan-integration  the integration tests against the ASan + UBSan daemon and tools
#   make deps       install the Debian packages the project builds and tests with
#   make demo       build, make the demo model, start siliceod, ask it a question, stop it
#   make install    PREFIX=/usr/local DESTDIR=
#   make fuzz       run every fuzz target for FUZZ_SECONDS (default 300) each
#   make format     clang-format the sources
#
# Sources are found by directory, so a new file needs no Makefile edit:
#   kernels/cpu/*.c    -> build/lib/libsil-kernels.a   (*_avx2.c / *_avx512.c get their ISA flags)
#   daemon/engine/*.c  -> build/lib/libsil-engine.a
#   libproto/*.c       -> build/lib/libsiliceo-proto.a
#   daemon/*.c         -> build/bin/siliceod           (daemon/main.c holds main)
#   client/common/*.c  -> linked into every client; client/sil-X.c -> build/bin/sil-X
#   bench/sil-X.c + bench/sil-X/*.c -> build/bin/sil-X; bench/common/*.c -> linked into every bench tool
#   tests/test_X.c (+ tests/testutil.c) -> build/tests/test_X
#   tests/fuzz/fuzz_X.c -> build/fuzz/fuzz_X (clang, libFuzzer + ASan + UBSan)

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= $(PREFIX)/sbin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
SYSCONFDIR ?= /etc

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

AVX2_FLAGS := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c

KERNEL_SRC := $(wildcard kernels/cpu/*.c)
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

CUDA_SRC := $(wildcard kernels/cuda/*.cu)

BINS := $(if $(wildcard daemon/main.c),$(B)/bin/siliceod) $(addprefix $(B)/bin/,$(CLIENTS) $(BENCHES))
TEST_BINS := $(addprefix $(B)/tests/,$(TESTS))
FUZZ_BINS := $(addprefix $(B)/fuzz/,$(FUZZERS))

.PHONY: all check check-unit check-integration check-fuzz check-mandoc check-asan \
	check-asan-integration check-cuda fuzz deps demo install uninstall clean format tests
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

ENGINE_LIBS := $(LIB_ENGINE) $(LIB_KERNELS)
ALL_LIBS := $(LIB_DAEMON) $(LIB_MKMODEL) $(LIB_ENGINE) $(LIB_KERNELS) $(LIB_CLIENT) $(LIB_PROTO)
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
$(B)/bin/$(1): $(call obj,client/$(1).c) $(LIB_CLIENT) $(LIB_PROTO)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -o $$@ $$^ $$(LDLIBS_PROTO) $$(LDLIBS_EDIT) -lm
endef
$(foreach c,$(CLIENTS),$(eval $(call client_bin,$(c))))

define bench_bin
$(B)/bin/$(1): $(call obj,bench/$(1).c $(wildcard bench/$(1)/*.c)) $(ENGINE_LIBS) $(LIB_BENCH)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -o $$@ $$^ $$(LDLIBS_ENGINE)
endef
$(foreach b,$(BENCHES),$(eval $(call bench_bin,$(b))))

define test_bin
$(B)/tests/$(1): $(call obj,tests/$(1).c $(TESTUTIL_SRC)) $(ALL_LIBS)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -o $$@ $$(call obj,tests/$(1).c $(TESTUTIL_SRC)) $(ALL_LIBS) -lcmocka $(ALL_LDLIBS)
endef
$(foreach t,$(TESTS),$(eval $(call test_bin,$(t))))

FUZZ_LIB_OBJS := $(call fobj,$(KERNEL_SRC) $(ENGINE_SRC) $(PROTO_SRC) $(DAEMON_SRC) $(MKMODEL_SRC))
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
$(eval $(call static_lib,$(A_LIB_KERNELS),$(call aobj,$(KERNEL_SRC))))
$(eval $(call static_lib,$(A_LIB_ENGINE),$(call aobj,$(ENGINE_SRC))))
$(eval $(call static_lib,$(A_LIB_PROTO),$(call aobj,$(PROTO_SRC))))
$(eval $(call static_lib,$(A_LIB_DAEMON),$(call aobj,$(DAEMON_SRC))))
$(eval $(call static_lib,$(A_LIB_CLIENT),$(call aobj,$(CLIENT_COMMON_SRC))))
$(eval $(call static_lib,$(A_LIB_BENCH),$(call aobj,$(BENCH_COMMON_SRC))))
$(eval $(call static_lib,$(A_LIB_MKMODEL),$(call aobj,$(MKMODEL_SRC))))
A_ALL_LIBS := $(A_LIB_DAEMON) $(A_LIB_MKMODEL) $(A_LIB_ENGINE) $(A_LIB_KERNELS) $(A_LIB_CLIENT) $(A_LIB_PROTO)

define asan_test_bin
$(ASAN_B)/tests/$(1): $(call aobj,tests/$(1).c $(TESTUTIL_SRC)) $(A_ALL_LIBS)
	@mkdir -p $$(dir $$@)
	$$(ASAN_CC) $$(ASAN_FLAGS) -o $$@ $$(call aobj,tests/$(1).c $(TESTUTIL_SRC)) $(A_ALL_LIBS) -lcmocka $(ALL_LDLIBS)
endef
$(foreach t,$(TESTS),$(eval $(call asan_test_bin,$(t))))

# Tests start some client and bench binaries (sil-chat, sil-mkmodel): those are sanitized too.
define asan_client_bin
$(ASAN_B)/bin/$(1): $(call aobj,client/$(1).c) $(A_LIB_CLIENT) $(A_LIB_PROTO)
	@mkdir -p $$(dir $$@)
	$$(ASAN_CC) $$(ASAN_FLAGS) -o $$@ $$^ $$(LDLIBS_PROTO) $$(LDLIBS_EDIT) -lm
endef
$(foreach c,$(CLIENTS),$(eval $(call asan_client_bin,$(c))))
define asan_bench_bin
$(ASAN_B)/bin/$(1): $(call aobj,bench/$(1).c $(wildcard bench/$(1)/*.c)) $(A_LIB_ENGINE) $(A_LIB_KERNELS) $(A_LIB_BENCH)
	@mkdir -p $$(dir $$@)
	$$(ASAN_CC) $$(ASAN_FLAGS) -o $$@ $$^ $$(LDLIBS_ENGINE)
endef
$(foreach b,$(BENCHES),$(eval $(call asan_bench_bin,$(b))))

ASAN_TEST_BINS := $(addprefix $(ASAN_B)/tests/,$(TESTS))
ASAN_BINS := $(addprefix $(ASAN_B)/bin/,$(CLIENTS) $(BENCHES))

# The sanitized daemon, for check-asan-integration.
$(ASAN_B)/bin/siliceod: $(call aobj,daemon/main.c) $(A_LIB_DAEMON) $(A_LIB_ENGINE) $(A_LIB_KERNELS) $(A_LIB_PROTO)
	@mkdir -p $(dir $@)
	$(ASAN_CC) $(ASAN_FLAGS) -o $@ $^ $(LDLIBS_DAEMON) $(LDLIBS_PROTO) $(LDLIBS_ENGINE)
ifneq ($(wildcard daemon/main.c),)
ASAN_BINS += $(ASAN_B)/bin/siliceod
endif

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

check-mandoc:
	@SHARED=$(SHARED) B=$(B) tests/run-all.sh mandoc

fuzz: $(FUZZ_BINS)
	@SHARED=$(SHARED) B=$(B) CHECK_FUZZ_SECONDS=$(FUZZ_SECONDS) tests/run-all.sh fuzz

check-cuda:
	@echo "check-cuda: no CUDA backend in this tree yet"

# ---- demo ----------------------------------------------------------------------------------------
demo: all
	@B=$(B) contrib/demo.sh

# ---- dependencies --------------------------------------------------------------------------------
DEB_PACKAGES := build-essential pkgconf libmsgpack-dev libsystemd-dev libcmocka-dev libpcre2-dev \
	libedit-dev mandoc clang libclang-rt-14-dev gnuplot-nox python3 systemd procps \
	python3-prometheus-client
deps:
	@if dpkg -s $(DEB_PACKAGES) >/dev/null 2>&1; then echo "deps: all packages present"; \
	else apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(DEB_PACKAGES); fi

# ---- install -------------------------------------------------------------------------------------
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
		$(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 \
		$(DESTDIR)$(MANDIR)/man7 $(DESTDIR)$(MANDIR)/man8
	$(if $(wildcard daemon/main.c),install -m 755 $(B)/bin/siliceod $(DESTDIR)$(SBINDIR)/)
	$(foreach b,$(CLIENTS) $(BENCHES),install -m 755 $(B)/bin/$(b) $(DESTDIR)$(BINDIR)/;)
	install -m 644 $(LIB_PROTO) $(DESTDIR)$(LIBDIR)/
	install -m 644 libproto/siliceo-proto.h $(DESTDIR)$(INCLUDEDIR)/
	$(PC_SED) > $(DESTDIR)$(LIBDIR)/pkgconfig/siliceo-proto.pc
	chmod 644 $(DESTDIR)$(LIBDIR)/pkgconfig/siliceo-proto.pc
	$(foreach s,1 5 7 8,$(foreach m,$(wildcard man/*.$(s)),install -m 644 $(m) $(DESTDIR)$(MANDIR)/man$(s)/;))

uninstall:
	rm -f $(DESTDIR)$(SBINDIR)/siliceod $(addprefix $(DESTDIR)$(BINDIR)/,$(CLIENTS) $(BENCHES)) \
		$(DESTDIR)$(LIBDIR)/libsiliceo-proto.a $(DESTDIR)$(INCLUDEDIR)/siliceo-proto.h \
		$(DESTDIR)$(LIBDIR)/pkgconfig/siliceo-proto.pc \
		$(foreach s,1 5 7 8,$(patsubst man/%,$(DESTDIR)$(MANDIR)/man$(s)/%,$(wildcard man/*.$(s))))

clean:
	rm -rf $(B)

format:
	clang-format -i $(wildcard kernels/cpu/*.[ch] daemon/*.[ch] daemon/engine/*.[ch] libproto/*.[ch] \
		client/*.[ch] client/common/*.[ch] bench/*.[ch] bench/*/*.[ch] tests/*.[ch] tests/fuzz/*.[ch])

-include $(shell find $(B) -name '*.d' 2>/dev/null)
