/*
 * kvm-exit-bench: a tiny KVM guest that causes a known number of exits of one kind.
 *
 * Creates a VM through /dev/kvm with 64 KiB of RAM and one vCPU in real mode, copies in
 * a loop of ITERATIONS x one exit-causing instruction (counter in %esi), runs it, and
 * prints one JSON line: iterations, KVM_RUN calls, userspace exits by reason, elapsed
 * TSC cycles and ns. With --target-cycles C the iteration count doubles until one run
 * takes at least C TSC cycles (kvm-unit-tests x86/vmexit.c style) and the last run is
 * reported.
 *
 * It looks like QEMU to kvm-utils: the vCPU thread is named "CPU 0/KVM" and
 * `-name guest=NAME` is accepted (and ignored), so /proc shows the VM name.
 *
 * No VMCALL mode: in a real-mode guest on a host without VMX/SVM (PVM) the instruction is
 * injected back as #UD and the guest, which has no IVT, never reaches the done port.
 *
 * pio_in_port reads a 32-bit value from --port P (default 0x608, the q35 ACPI PM timer: what
 * a guest whose clocksource fell back to acpi_pm does on every clock read).
 *
 * --wait-stdin: after creating the VM, print "ready" to stderr and wait for a line on stdin
 * before running; after printing the result, stay alive until stdin reaches EOF. Tests use
 * it to start tracing first and to keep /proc naming the VM until they are done.
 * --repeat (implies --wait-stdin): every further line on stdin runs the loop again in the
 * same VM and prints another result line; bench/kvm_utils_overhead.py toggles tracing
 * between runs without paying for VM creation each time.
 *
 * cpu_ns in the result is the vCPU thread's own CPU time during the loop (user + sys):
 * unlike ns it does not count time the thread waited while preempted.
 *
 * usage: kvm-exit-bench [-name guest=NAME] [--target-cycles C] [--linger-ms MS] [--delay-ms MS]
 *                       [--port P] [--wait-stdin] [--repeat] MODE ITERATIONS
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define MEM_SIZE 0x10000
#define CODE_GPA 0x1000
#define MMIO_GPA 0x20000   /* ds = 0x2000, offset 0: outside every memslot */
#define DONE_PORT 0xf1
#define USER_PORT 0x10

/* One real-mode loop per mode: prologue sets ds for MMIO, the body runs %esi times. */
#define GUEST(name, body)                                                        \
    extern const unsigned char g_##name[], g_##name##_end[];                     \
    asm(".pushsection .rodata\n.code16\n"                                        \
        "g_" #name ":\n"                                                          \
        "mov $0x2000, %ax\nmov %ax, %ds\nxor %bx, %bx\n"                          \
        "1:\n" body "\n"                                                          \
        "dec %esi\njnz 1b\n"                                                      \
        "out %al, $0xf1\nhlt\n"                                                   \
        "g_" #name "_end:\n.code64\n.popsection\n");

GUEST(nop, "nop")
GUEST(pio_out, "out %al, $0x10")
GUEST(pio_in, "in $0x10, %al")
GUEST(pio_in_port, "in (%dx), %eax")         /* 32-bit IN from --port (in %dx) */
GUEST(pio_kernel, "in $0x21, %al")          /* PIC mask register: in-kernel irqchip */
GUEST(mmio_write, "movb %al, (%bx)")
GUEST(mmio_read, "movb (%bx), %al")
GUEST(cpuid, "xor %eax, %eax\ncpuid")
GUEST(hlt, "hlt")
GUEST(rdmsr, "mov $0x10, %ecx\nrdmsr")      /* IA32_TSC */
GUEST(wrmsr, "mov $0x6e0, %ecx\nxor %eax, %eax\nxor %edx, %edx\nwrmsr") /* TSC_DEADLINE=0 */

struct mode {
    const char *name;
    const unsigned char *start, *end;
    int irqchip;   /* needs the in-kernel PIC/IOAPIC/LAPIC */
};

#define MODE(n, irq) {#n, g_##n, g_##n##_end, irq}
static const struct mode modes[] = {
    MODE(nop, 0), MODE(pio_out, 0), MODE(pio_in, 0), MODE(pio_in_port, 0), MODE(pio_kernel, 1),
    MODE(mmio_write, 0), MODE(mmio_read, 0), MODE(cpuid, 0), MODE(hlt, 0),
    MODE(rdmsr, 0), MODE(wrmsr, 1),
};

static const char *exit_names[] = {
    "UNKNOWN", "EXCEPTION", "IO", "HYPERCALL", "DEBUG", "HLT", "MMIO", "IRQ_WINDOW_OPEN",
    "SHUTDOWN", "FAIL_ENTRY", "INTR", "SET_TPR", "TPR_ACCESS", "S390_SIEIC", "S390_RESET",
    "DCR", "NMI", "INTERNAL_ERROR",
};
#define NNAMES (sizeof(exit_names) / sizeof(exit_names[0]))

static uint16_t port_arg = 0x608;

static void die(const char *what) {
    printf("{\"error\": \"%s: %s\"}\n", what, strerror(errno));
    exit(3);
}

struct vm {
    int kvm, vm, vcpu;
    struct kvm_run *run;
    unsigned char *mem;
};

static void vm_create(struct vm *v, const struct mode *m) {
    v->kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (v->kvm < 0) die("open /dev/kvm");
    v->vm = ioctl(v->kvm, KVM_CREATE_VM, 0);
    if (v->vm < 0) die("KVM_CREATE_VM");
    v->mem = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (v->mem == MAP_FAILED) die("mmap guest memory");
    struct kvm_userspace_memory_region r = {
        .slot = 0, .guest_phys_addr = 0, .memory_size = MEM_SIZE,
        .userspace_addr = (uintptr_t)v->mem};
    if (ioctl(v->vm, KVM_SET_USER_MEMORY_REGION, &r) < 0) die("KVM_SET_USER_MEMORY_REGION");
    if (m->irqchip && ioctl(v->vm, KVM_CREATE_IRQCHIP, 0) < 0) die("KVM_CREATE_IRQCHIP");
    v->vcpu = ioctl(v->vm, KVM_CREATE_VCPU, 0);
    if (v->vcpu < 0) die("KVM_CREATE_VCPU");
    int sz = ioctl(v->kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    if (sz < 0) die("KVM_GET_VCPU_MMAP_SIZE");
    v->run = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, v->vcpu, 0);
    if (v->run == MAP_FAILED) die("mmap kvm_run");
    memcpy(v->mem + CODE_GPA, m->start, m->end - m->start);
}

static void vcpu_reset(struct vm *v, uint32_t iterations) {
    struct kvm_sregs s;
    if (ioctl(v->vcpu, KVM_GET_SREGS, &s) < 0) die("KVM_GET_SREGS");
    s.cs.base = 0; s.cs.selector = 0;
    s.ds.base = 0; s.ds.selector = 0;
    if (ioctl(v->vcpu, KVM_SET_SREGS, &s) < 0) die("KVM_SET_SREGS");
    struct kvm_regs r = {.rip = CODE_GPA, .rflags = 2, .rsi = iterations, .rdx = port_arg};
    if (ioctl(v->vcpu, KVM_SET_REGS, &r) < 0) die("KVM_SET_REGS");
}

struct result {
    uint64_t runs, cycles, ns, cpu_ns, exits[NNAMES + 1];
};

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* Run the guest loop once; returns 0 when the guest reached the done port. */
static void run_once(struct vm *v, uint32_t iterations, struct result *res) {
    memset(res, 0, sizeof(*res));
    vcpu_reset(v, iterations);
    uint64_t t0 = now_ns(), c0 = __rdtsc(), u0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (;;) {
        if (ioctl(v->vcpu, KVM_RUN, 0) < 0) {
            if (errno == EINTR) continue;
            die("KVM_RUN");
        }
        res->runs++;
        uint32_t why = v->run->exit_reason;
        res->exits[why < NNAMES ? why : NNAMES]++;
        if (why == KVM_EXIT_IO && v->run->io.port == DONE_PORT) break;
        if (why == KVM_EXIT_IO || why == KVM_EXIT_HLT || why == KVM_EXIT_MMIO) continue;
        printf("{\"error\": \"unexpected exit %u (%s) after %llu runs\"}\n", why,
               why < NNAMES ? exit_names[why] : "?", (unsigned long long)res->runs);
        exit(4);
    }
    res->cycles = __rdtsc() - c0;
    res->ns = now_ns() - t0;
    res->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - u0;   /* this thread only, user + sys */
    res->exits[KVM_EXIT_IO]--;   /* the done signal is not part of the loop */
    res->runs--;
}

static void print_result(const struct mode *m, uint64_t iterations, const struct result *res, int khz) {
    printf("{\"mode\": \"%s\", \"iterations\": %llu, \"runs\": %llu, \"tsc_cycles\": %llu, "
           "\"ns\": %llu, \"cpu_ns\": %llu, \"tsc_khz\": %d, \"pid\": %d, \"userspace_exits\": {",
           m->name, (unsigned long long)iterations, (unsigned long long)res->runs,
           (unsigned long long)res->cycles, (unsigned long long)res->ns, (unsigned long long)res->cpu_ns,
           khz, getpid());
    const char *sep = "";
    for (size_t i = 0; i <= NNAMES; i++) {
        if (!res->exits[i]) continue;
        printf("%s\"%s\": %llu", sep, i < NNAMES ? exit_names[i] : "OTHER", (unsigned long long)res->exits[i]);
        sep = ", ";
    }
    printf("}}\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    uint64_t target = 0, linger_ms = 0, delay_ms = 0;
    int wait_stdin = 0, repeat = 0;
    const char *name = NULL, *count = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-name") && i + 1 < argc) i++;
        else if (!strcmp(argv[i], "--target-cycles") && i + 1 < argc) target = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--linger-ms") && i + 1 < argc) linger_ms = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--delay-ms") && i + 1 < argc) delay_ms = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--port") && i + 1 < argc) port_arg = (uint16_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--wait-stdin")) wait_stdin = 1;
        else if (!strcmp(argv[i], "--repeat")) repeat = wait_stdin = 1;
        else if (!name) name = argv[i];
        else count = argv[i];
    }
    if (!name || !count) {
        fprintf(stderr, "usage: %s [-name guest=NAME] [--target-cycles C] [--linger-ms MS] [--delay-ms MS] "
                "[--port P] [--wait-stdin] [--repeat] MODE ITERATIONS\nmodes:", argv[0]);
        for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) fprintf(stderr, " %s", modes[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    const struct mode *m = NULL;
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
        if (!strcmp(modes[i].name, name)) m = &modes[i];
    if (!m) { fprintf(stderr, "unknown mode %s\n", name); return 2; }
    uint64_t iterations = strtoull(count, NULL, 0);
    if (iterations < 1 || iterations > 0xffffffffull) { fprintf(stderr, "bad ITERATIONS\n"); return 2; }

    prctl(PR_SET_NAME, "CPU 0/KVM");
    struct vm v;
    vm_create(&v, m);
    if (delay_ms) usleep(delay_ms * 1000);   /* let a tracer attach to this vCPU thread first */
    char go[64];
    if (wait_stdin) {
        fprintf(stderr, "ready pid %d\n", getpid());
        if (read(0, go, sizeof(go)) <= 0) return 5;   /* stdin closed: the tracer gave up */
    }
    struct result res;
    run_once(&v, (uint32_t)iterations, &res);
    while (target && res.cycles < target && iterations * 2 <= 0xffffffffull) {
        iterations *= 2;
        run_once(&v, (uint32_t)iterations, &res);
    }
    int khz = ioctl(v.vcpu, KVM_GET_TSC_KHZ, 0);
    print_result(m, iterations, &res, khz);
    if (linger_ms) usleep(linger_ms * 1000);   /* stay visible in /proc for tracers */
    while (wait_stdin && read(0, go, sizeof(go)) > 0) {
        if (!repeat) continue;
        run_once(&v, (uint32_t)iterations, &res);  /* same VM, same ITERATIONS, one result line per line */
        print_result(m, iterations, &res, khz);
    }
    return 0;
}
