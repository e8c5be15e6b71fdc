/*
 * kvm-guest-bench: exit costs as a guest sees them. A static binary: copy it into any x86-64
 * Linux VM (no libc or packages needed there) and run it as root.
 *
 * Tests (cycles and ns per iteration, iterations doubling until a run takes --target-cycles
 * TSC cycles, as kvm-unit-tests x86/vmexit.c does; best of --repeat runs):
 *   rdtsc          RDTSC in a loop: no exit on KVM (the baseline)
 *   cpuid          CPUID leaf 0: always exits (VMX/SVM intercept it unconditionally)
 *   clock_gettime  CLOCK_MONOTONIC: vDSO + TSC ~20-50 ns; with acpi_pm/hpet every call exits
 *   pio_in         32-bit IN from --port (default 0x608, q35 ACPI PM timer; ioperm/iopl,
 *                  root, a kernel with CONFIG_X86_IOPL_IOPERM)
 *   mmio_read      32-bit read of --mmio-gpa (default 0xfed000f0, HPET main counter) via
 *                  /dev/mem (root; CONFIG_STRICT_DEVMEM allows it for non-RAM ranges)
 * pio_in/mmio_read touch device registers: they refuse to run unless CPUID says we are in a
 * VM (hypervisor bit), or --force is given.
 *
 * Output: one JSON object: clocksource, hypervisor signature, tsc_khz estimate, results.
 *
 * usage: kvm-guest-bench [--tests a,b,...] [--target-cycles C] [--repeat R] [--port P]
 *                        [--mmio-gpa A] [--force]
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

static uint16_t port = 0x608;
static uint64_t mmio_gpa = 0xfed000f0;
static volatile uint32_t *mmio;
static volatile uint64_t sink;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void t_rdtsc(uint64_t n) { for (uint64_t i = 0; i < n; i++) sink += __rdtsc(); }
static void t_cpuid(uint64_t n) {
    unsigned a, b, c, d;
    for (uint64_t i = 0; i < n; i++) { __cpuid(0, a, b, c, d); sink += a; }
}
static void t_gettime(uint64_t n) {
    struct timespec ts;
    for (uint64_t i = 0; i < n; i++) { clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec; }
}
static void t_pio(uint64_t n) { for (uint64_t i = 0; i < n; i++) sink += inl(port); }
static void t_mmio(uint64_t n) { for (uint64_t i = 0; i < n; i++) sink += *mmio; }

struct test {
    const char *name;
    void (*fn)(uint64_t);
    int device;   /* touches device registers: only inside a VM (or --force) */
};
static const struct test tests[] = {
    {"rdtsc", t_rdtsc, 0}, {"cpuid", t_cpuid, 0}, {"clock_gettime", t_gettime, 0},
    {"pio_in", t_pio, 1}, {"mmio_read", t_mmio, 1},
};
#define NTESTS (sizeof(tests) / sizeof(tests[0]))

static int in_vm(char sig[13]) {
    unsigned a, b, c, d;
    __cpuid(1, a, b, c, d);
    memset(sig, 0, 13);
    if (!(c & (1u << 31))) return 0;
    __cpuid(0x40000000, a, b, c, d);
    memcpy(sig, &b, 4); memcpy(sig + 4, &c, 4); memcpy(sig + 8, &d, 4);
    for (int i = 0; i < 12; i++) if (sig[i] && (sig[i] < 32 || sig[i] > 126)) sig[i] = '?';
    return 1;
}

static int setup(const struct test *t, char *err, size_t len) {
    if (t->fn == t_pio && ioperm(port, 4, 1) < 0 && iopl(3) < 0) {
        snprintf(err, len, "ioperm/iopl: %s (%s)", strerror(errno),
                 errno == ENOSYS ? "kernel built without CONFIG_X86_IOPL_IOPERM" : "run as root");
        return -1;
    }
    if (t->fn == t_mmio && !mmio) {
        int fd = open("/dev/mem", O_RDONLY | O_SYNC);
        if (fd < 0) { snprintf(err, len, "open /dev/mem: %s", strerror(errno)); return -1; }
        uint64_t page = mmio_gpa & ~0xfffull;
        void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, (off_t)page);
        close(fd);
        if (p == MAP_FAILED) { snprintf(err, len, "mmap /dev/mem at %#llx: %s", (unsigned long long)page, strerror(errno)); return -1; }
        mmio = (volatile uint32_t *)((char *)p + (mmio_gpa & 0xfff));
    }
    return 0;
}

static void clocksource(char *out, size_t len) {
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    out[0] = 0;
    if (f) { if (fgets(out, (int)len, f)) out[strcspn(out, "\n")] = 0; fclose(f); }
}

int main(int argc, char **argv) {
    const char *want = "rdtsc,cpuid,clock_gettime,pio_in,mmio_read";
    uint64_t target = 1ull << 28;
    int repeat = 3, force = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tests") && i + 1 < argc) want = argv[++i];
        else if (!strcmp(argv[i], "--target-cycles") && i + 1 < argc) target = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--port") && i + 1 < argc) port = (uint16_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--mmio-gpa") && i + 1 < argc) mmio_gpa = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--force")) force = 1;
        else {
            fprintf(stderr, "usage: %s [--tests a,b,...] [--target-cycles C] [--repeat R] [--port P] "
                            "[--mmio-gpa A] [--force]\ntests:", argv[0]);
            for (size_t t = 0; t < NTESTS; t++) fprintf(stderr, " %s", tests[t].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    char sig[13], cs[64];
    int vm = in_vm(sig);
    clocksource(cs, sizeof(cs));
    uint64_t c0 = __rdtsc(), n0 = now_ns();
    usleep(100000);
    double tsc_khz = (double)(__rdtsc() - c0) * 1e6 / (double)(now_ns() - n0);
    printf("{\"in_vm\": %s, \"hypervisor\": \"%s\", \"clocksource\": \"%s\", \"tsc_khz\": %.0f, "
           "\"port\": \"%#x\", \"mmio_gpa\": \"%#llx\", \"results\": [",
           vm ? "true" : "false", sig, cs, tsc_khz, port, (unsigned long long)mmio_gpa);
    const char *sep = "";
    for (size_t t = 0; t < NTESTS; t++) {
        char list[256];
        snprintf(list, sizeof(list), ",%s,", want);
        char key[64];
        snprintf(key, sizeof(key), ",%s,", tests[t].name);
        if (!strstr(list, key)) continue;
        char err[160] = "";
        if (tests[t].device && !vm && !force)
            snprintf(err, sizeof(err), "not in a VM (no CPUID hypervisor bit): refusing to touch device registers; --force overrides");
        else
            setup(&tests[t], err, sizeof(err));
        if (err[0]) {
            printf("%s{\"name\": \"%s\", \"error\": \"%s\"}", sep, tests[t].name, err);
            sep = ", ";
            continue;
        }
        double best_c = 0, best_ns = 0;
        uint64_t iters = 0;
        for (int r = 0; r < (repeat > 0 ? repeat : 1); r++) {
            uint64_t n = 64, cyc, ns;
            for (;;) {
                uint64_t s0 = now_ns(), k0 = __rdtsc();
                tests[t].fn(n);
                cyc = __rdtsc() - k0;
                ns = now_ns() - s0;
                if (cyc >= target || n >= (1ull << 40)) break;
                n *= 2;
            }
            double c = (double)cyc / n, d = (double)ns / n;
            if (!iters || c < best_c) { best_c = c; best_ns = d; iters = n; }
        }
        printf("%s{\"name\": \"%s\", \"iterations\": %llu, \"cycles_per_iter\": %.1f, \"ns_per_iter\": %.1f}",
               sep, tests[t].name, (unsigned long long)iters, best_c, best_ns);
        sep = ", ";
    }
    printf("]}\n");
    return 0;
}
