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
 * LAPIC modes (kvm-unit-tests x86/vmexit.c's ipi, ipi+halt, tscdeadline, tscdeadline_immed):
 * an in-kernel irqchip (KVM_CREATE_IRQCHIP), CPUID with x2APIC and TSC-deadline, the guest
 * switches its LAPIC to x2APIC and handles interrupts through a real-mode IVT. The guest
 * times each operation itself with RDTSC (from before the WRMSR to after its handler ran)
 * and keeps the last 16384 times in memory: the result adds op_samples, op_cycles_p50 and
 * op_cycles_p99 (nearest rank), so one preemption shows in p99 and not in the median.
 *   tscdeadline        WRMSR 0x6e0 = now + --deadline-cycles (default 3000, as kvm-unit-tests)
 *                      with LVTT (0x832) in TSC-deadline mode; wait for the timer interrupt
 *   tscdeadline_immed  the same with a deadline of now (already past when armed)
 *   tscdeadline_halt   arm the deadline with interrupts off, then `sti; hlt`: exactly one HLT exit
 *                      per operation, the vCPU woken by the timer (with a deadline longer than
 *                      the host's halt polling, every one a wake-up of a blocked vCPU)
 *   ipi                WRMSR 0x830 (x2APIC ICR, fixed, physical) to vCPU 1, which spins with
 *                      interrupts on; wait for its handler to have run
 *   ipi_halt           the same to vCPU 1 sitting in HLT: the sender waits until vCPU 1 said it
 *                      halts, then 2000 cycles more (untimed), as kvm-unit-tests' ipi+halt does
 *   icr_self           WRMSR 0x830 with the destination shorthand "self" and vector --vector V
 *                      (default 0xfc, Linux's CALL_FUNCTION: a TLB shootdown) while interrupts are
 *                      off: the sender's exit of an IPI storm without its delivery, so the time is
 *                      the ICR write's alone (kvm-utils diagnose's ipi-storm rule, driven live)
 * vCPU 1 is a second thread ("CPU 1/KVM"). A capability the kernel lacks (KVM_CHECK_EXTENSION)
 * or an ioctl it refuses is reported as {"error": ...} naming it; a guest that gets no
 * interrupt for 5 s is stopped (a watchdog signal) and reported instead of hanging.
 *
 * usage: kvm-exit-bench [-name guest=NAME] [--target-cycles C] [--linger-ms MS] [--delay-ms MS]
 *                       [--port P] [--deadline-cycles C] [--vector V] [--wait-stdin] [--repeat]
 *                       MODE ITERATIONS
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define MEM_SIZE 0x20000  /* 0x10000-0x1ffff: the LAPIC modes' per-operation times */
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

/*
 * The LAPIC modes' guest: one blob, entry points by label (offsets from g_apic). Data in
 * low memory: FLAG (set by the interrupt handler), READY (vCPU 1 has enabled its LAPIC),
 * HALTING (vCPU 1 is about to HLT), PROGRESS (operations done: the host's watchdog reads it).
 * Times go to es:di (es = 0x1000, GPA 0x10000); di wraps at 64 KiB, so the buffer holds the
 * last 16384. Inputs: %esi iterations, %ebx the deadline offset (tscdeadline modes).
 * Every exception vector points at a stub that reports its number on port 0xf2: a guest
 * instruction the hypervisor does not handle shows as an error, not as a hang.
 */
#define FLAG 0x500
#define READY 0x502
#define HALTING 0x503
#define PROGRESS 0x504
#define EXC_PORT 0xf2
#define IPI_VECTOR 0xb0     /* kvm-unit-tests' IPI_TEST_VECTOR */
#define TIMER_VECTOR 0xef   /* kvm-unit-tests' TSC_DEADLINE_TIMER_VECTOR */
#define STR_(x) #x
#define STR(x) STR_(x)
extern const unsigned char g_apic[], g_apic_end[], g_tscdl[], g_tscdl_halt[], g_ipi[], g_ipi_halt[], g_icr_self[],
    g_ap_spin[], g_ap_halt[], g_isr[], g_iret[], g_exc[];
asm(".pushsection .rodata\n.code16\n"
    "g_apic:\n"
    "seg_setup:\n"                            /* ds = ss = 0, es = samples, di = 0 */
    "xor %ax, %ax\nmov %ax, %ds\nmov %ax, %ss\nmov $0x1000, %ax\nmov %ax, %es\nxor %di, %di\nret\n"
    "apic_on:\n"                              /* IA32_APIC_BASE |= EN | EXTD; SVR = enabled, vector 0xff */
    "mov $0x1b, %ecx\nrdmsr\nor $0xc00, %eax\nwrmsr\n"
    "mov $0x80f, %ecx\nmov $0x1ff, %eax\nxor %edx, %edx\nwrmsr\nret\n"
    "op_done:\n"                              /* time since %ebp -> es:di, count it */
    "rdtsc\nsub %ebp, %eax\nmov %eax, %es:(%di)\nadd $4, %di\naddl $1, " STR(PROGRESS) "\nret\n"
    "g_tscdl:\n"
    "mov $0x8000, %sp\ncall seg_setup\ncall apic_on\n"
    "mov $0x832, %ecx\nmov $(0x40000 | " STR(TIMER_VECTOR) "), %eax\nxor %edx, %edx\nwrmsr\n" /* LVTT: TSC-deadline */
    "sti\n"
    "1:\nmovb $0, " STR(FLAG) "\n"
    "rdtsc\nmov %eax, %ebp\nadd %ebx, %eax\nadc $0, %edx\nmov $0x6e0, %ecx\nwrmsr\n"
    "2:\ncmpb $0, " STR(FLAG) "\nje 2b\n"
    "call op_done\ndec %esi\njnz 1b\n"
    "cli\nout %al, $0xf1\nhlt\n"
    "g_tscdl_halt:\n"                        /* arm the deadline, then sleep in HLT until it fires */
    "mov $0x8000, %sp\ncall seg_setup\ncall apic_on\n"
    "mov $0x832, %ecx\nmov $(0x40000 | " STR(TIMER_VECTOR) "), %eax\nxor %edx, %edx\nwrmsr\n"
    "1:\ncli\nmovb $0, " STR(FLAG) "\n"
    "rdtsc\nmov %eax, %ebp\nadd %ebx, %eax\nadc $0, %edx\nmov $0x6e0, %ecx\nwrmsr\n"
    "sti\nhlt\n"                              /* STI's shadow: the interrupt waits for HLT */
    "2:\ncmpb $0, " STR(FLAG) "\nje 2b\n"
    "call op_done\ndec %esi\njnz 1b\n"
    "cli\nout %al, $0xf1\nhlt\n"
    "g_ipi:\n"                                /* vCPU 0: IPIs to a running vCPU 1 */
    "mov $0x8000, %sp\ncall seg_setup\ncall apic_on\n"
    "3:\ncmpb $0, " STR(READY) "\nje 3b\n"
    "1:\nmovb $0, " STR(FLAG) "\n"
    "rdtsc\nmov %eax, %ebp\n"
    "mov $0x830, %ecx\nmov $(0x4000 | " STR(IPI_VECTOR) "), %eax\nmov $1, %edx\nwrmsr\n" /* fixed, physical, to 1 */
    "2:\ncmpb $0, " STR(FLAG) "\nje 2b\n"
    "call op_done\ndec %esi\njnz 1b\n"
    "out %al, $0xf1\nhlt\n"
    "g_ipi_halt:\n"                           /* vCPU 0: IPIs to vCPU 1 once it sits in HLT */
    "mov $0x8000, %sp\ncall seg_setup\ncall apic_on\n"
    "3:\ncmpb $0, " STR(READY) "\nje 3b\n"
    "1:\nmovb $0, " STR(FLAG) "\n"
    "4:\ncmpb $0, " STR(HALTING) "\nje 4b\n"
    "rdtsc\nmov %eax, %ebp\nadd $2000, %ebp\n5:\nrdtsc\ncmp %ebp, %eax\njb 5b\n" /* 2000 cycles more */
    "movb $0, " STR(HALTING) "\n"
    "rdtsc\nmov %eax, %ebp\n"
    "mov $0x830, %ecx\nmov $(0x4000 | " STR(IPI_VECTOR) "), %eax\nmov $1, %edx\nwrmsr\n"
    "2:\ncmpb $0, " STR(FLAG) "\nje 2b\n"
    "call op_done\ndec %esi\njnz 1b\n"
    "out %al, $0xf1\nhlt\n"
    "g_icr_self:\n"                           /* ICR writes to itself (%ebx: vector), IF stays 0 */
    "mov $0x8000, %sp\ncall seg_setup\ncall apic_on\n"
    "1:\nrdtsc\nmov %eax, %ebp\n"
    "mov $0x830, %ecx\nmov %ebx, %eax\nor $0x44000, %eax\nxor %edx, %edx\nwrmsr\n" /* fixed, self */
    "call op_done\ndec %esi\njnz 1b\n"
    "out %al, $0xf1\nhlt\n"
    "g_ap_spin:\n"                            /* vCPU 1 for ipi: interrupts on, never halts */
    "mov $0x9000, %sp\ncall seg_setup\ncall apic_on\nsti\nmovb $1, " STR(READY) "\n"
    "1:\njmp 1b\n"
    "g_ap_halt:\n"                            /* vCPU 1 for ipi_halt: says so, then HLT */
    /* cli ... sti; hlt (the kernel's safe_halt): STI's one-instruction shadow holds the IPI
     * until HLT has begun. With interrupts on while it said so, an IPI that came between the
     * store and the HLT ran its handler first, returned into the HLT, and vCPU 1 slept with
     * HALTING clear, so vCPU 0 waited forever (one run in six stalled this way). */
    "mov $0x9000, %sp\ncall seg_setup\ncall apic_on\nsti\nmovb $1, " STR(READY) "\n"
    "1:\ncli\nmovb $1, " STR(HALTING) "\nsti\nhlt\njmp 1b\n"
    "g_isr:\n"                                /* both vectors: flag it, EOI (x2APIC 0x80b) */
    "pushal\nmovb $1, " STR(FLAG) "\nmov $0x80b, %ecx\nxor %eax, %eax\nxor %edx, %edx\nwrmsr\npopal\niret\n"
    "g_iret:\niret\n"                         /* the spurious vector 0xff: no EOI */
    "g_exc:\n"                                /* 32 stubs of 4 bytes: vector -> port 0xf2 */
    ".irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31\n"
    "mov $\\n, %al\nout %al, $" STR(EXC_PORT) "\n.endr\n"
    "g_apic_end:\n.code64\n.popsection\n");

enum apic_kind { NO_APIC, APIC_TIMER, APIC_IPI, APIC_SELF };

struct mode {
    const char *name;
    const unsigned char *start, *end;
    int irqchip;   /* needs the in-kernel PIC/IOAPIC/LAPIC */
    enum apic_kind apic;
    const unsigned char *entry, *ap_entry;   /* LAPIC modes: vCPU 0's and vCPU 1's code in g_apic */
    uint32_t deadline;                       /* tscdeadline modes: default offset of the deadline */
};

#define MODE(n, irq) {#n, g_##n, g_##n##_end, irq, NO_APIC, NULL, NULL, 0}
#define APIC_MODE(n, kind, entry, ap, dl) {#n, g_apic, g_apic_end, 1, kind, entry, ap, dl}
static const struct mode modes[] = {
    MODE(nop, 0), MODE(pio_out, 0), MODE(pio_in, 0), MODE(pio_in_port, 0), MODE(pio_kernel, 1),
    MODE(mmio_write, 0), MODE(mmio_read, 0), MODE(cpuid, 0), MODE(hlt, 0),
    MODE(rdmsr, 0), MODE(wrmsr, 1),
    APIC_MODE(tscdeadline, APIC_TIMER, g_tscdl, NULL, 3000),
    APIC_MODE(tscdeadline_immed, APIC_TIMER, g_tscdl, NULL, 0),
    APIC_MODE(tscdeadline_halt, APIC_TIMER, g_tscdl_halt, NULL, 3000),
    APIC_MODE(ipi, APIC_IPI, g_ipi, g_ap_spin, 0),
    APIC_MODE(ipi_halt, APIC_IPI, g_ipi_halt, g_ap_halt, 0),
    APIC_MODE(icr_self, APIC_SELF, g_icr_self, NULL, 0),
};

static const char *exit_names[] = {
    "UNKNOWN", "EXCEPTION", "IO", "HYPERCALL", "DEBUG", "HLT", "MMIO", "IRQ_WINDOW_OPEN",
    "SHUTDOWN", "FAIL_ENTRY", "INTR", "SET_TPR", "TPR_ACCESS", "S390_SIEIC", "S390_RESET",
    "DCR", "NMI", "INTERNAL_ERROR",
};
#define NNAMES (sizeof(exit_names) / sizeof(exit_names[0]))

static uint16_t port_arg = 0x608;

static uint32_t deadline_arg = UINT32_MAX;   /* --deadline-cycles; default: the mode's */

static uint32_t vector_arg = 0xfc;           /* --vector (icr_self) */

static void die(const char *what) {
    printf("{\"error\": \"%s: %s\"}\n", what, strerror(errno));
    exit(3);
}

static void fail(const char *msg) {   /* msg has no quotes or backslashes */
    printf("{\"error\": \"%s\"}\n", msg);
    exit(3);
}

struct vm {
    int kvm, vm, vcpu, vcpu1;
    struct kvm_run *run, *run1;
    unsigned char *mem;
};

/* The LAPIC modes need these; each missing one is named (a software hypervisor may lack them). */
static void require_caps(int kvm, const struct mode *m) {
    static const struct { int cap; const char *name, *why; enum apic_kind kind; } caps[] = {
        {KVM_CAP_IRQCHIP, "KVM_CAP_IRQCHIP", "no in-kernel LAPIC to deliver the interrupt", APIC_TIMER},
        {KVM_CAP_IRQCHIP, "KVM_CAP_IRQCHIP", "no in-kernel LAPIC to deliver the IPI", APIC_IPI},
        {KVM_CAP_IRQCHIP, "KVM_CAP_IRQCHIP", "no in-kernel LAPIC to take the ICR write", APIC_SELF},
        {KVM_CAP_TSC_DEADLINE_TIMER, "KVM_CAP_TSC_DEADLINE_TIMER", "no TSC-deadline mode in the LAPIC timer",
         APIC_TIMER},
    };
    char msg[256];
    for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
        if (caps[i].kind != m->apic || ioctl(kvm, KVM_CHECK_EXTENSION, caps[i].cap) > 0) continue;
        snprintf(msg, sizeof(msg), "%s: this KVM lacks it (%s)", caps[i].name, caps[i].why);
        fail(msg);
    }
    if (m->apic == APIC_IPI && ioctl(kvm, KVM_CHECK_EXTENSION, KVM_CAP_MAX_VCPUS) < 2)
        fail("KVM_CAP_MAX_VCPUS < 2: this KVM runs one vCPU per VM (the IPI needs a second vCPU)");
}

/* CPUID as KVM supports it, plus x2APIC and TSC-deadline (leaf 1 ECX bits 21 and 24): without
 * them KVM refuses IA32_APIC_BASE.EXTD and keeps LVTT out of TSC-deadline mode. */
static void set_cpuid(int kvm, int vcpu) {
    static struct { struct kvm_cpuid2 c; struct kvm_cpuid_entry2 e[256]; } buf;
    buf.c.nent = 256;
    if (ioctl(kvm, KVM_GET_SUPPORTED_CPUID, &buf.c) < 0) die("KVM_GET_SUPPORTED_CPUID");
    for (uint32_t i = 0; i < buf.c.nent; i++)
        if (buf.c.entries[i].function == 1) buf.c.entries[i].ecx |= (1u << 21) | (1u << 24);
    if (ioctl(vcpu, KVM_SET_CPUID2, &buf.c) < 0) die("KVM_SET_CPUID2");
}

static void set_ivt(unsigned char *mem) {
    uint16_t *ivt = (uint16_t *)mem;   /* vector n: offset at 4n, segment 0 at 4n + 2 */
    for (int n = 0; n < 256; n++) {
        const unsigned char *h = n < 32 ? g_exc + 4 * n : n == IPI_VECTOR || n == TIMER_VECTOR ? g_isr : g_iret;
        ivt[2 * n] = (uint16_t)(CODE_GPA + (h - g_apic));
        ivt[2 * n + 1] = 0;
    }
}

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
    if (m->apic) require_caps(v->kvm, m);
    if (m->irqchip && ioctl(v->vm, KVM_CREATE_IRQCHIP, 0) < 0) die("KVM_CREATE_IRQCHIP");
    v->vcpu = ioctl(v->vm, KVM_CREATE_VCPU, 0);
    if (v->vcpu < 0) die("KVM_CREATE_VCPU");
    int sz = ioctl(v->kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    if (sz < 0) die("KVM_GET_VCPU_MMAP_SIZE");
    v->run = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, v->vcpu, 0);
    if (v->run == MAP_FAILED) die("mmap kvm_run");
    memcpy(v->mem + CODE_GPA, m->start, m->end - m->start);
    if (!m->apic) return;
    set_cpuid(v->kvm, v->vcpu);
    set_ivt(v->mem);
    if (m->apic != APIC_IPI) return;
    v->vcpu1 = ioctl(v->vm, KVM_CREATE_VCPU, 1);
    if (v->vcpu1 < 0) die("KVM_CREATE_VCPU (a second vCPU, id 1)");
    v->run1 = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, v->vcpu1, 0);
    if (v->run1 == MAP_FAILED) die("mmap kvm_run of vCPU 1");
    set_cpuid(v->kvm, v->vcpu1);
    /* An AP with an in-kernel LAPIC waits for INIT/SIPI; this guest has no BIOS to send them. */
    struct kvm_mp_state mp = {.mp_state = KVM_MP_STATE_RUNNABLE};
    if (ioctl(v->vcpu1, KVM_SET_MP_STATE, &mp) < 0) die("KVM_SET_MP_STATE (vCPU 1 runnable)");
}

static void set_cpu(int vcpu, uint64_t rip, uint32_t iterations, uint32_t rbx) {
    struct kvm_sregs s;
    if (ioctl(vcpu, KVM_GET_SREGS, &s) < 0) die("KVM_GET_SREGS");
    s.cs.base = 0; s.cs.selector = 0;
    s.ds.base = 0; s.ds.selector = 0;
    if (ioctl(vcpu, KVM_SET_SREGS, &s) < 0) die("KVM_SET_SREGS");
    struct kvm_regs r = {.rip = rip, .rflags = 2, .rsi = iterations, .rdx = port_arg, .rbx = rbx};
    if (ioctl(vcpu, KVM_SET_REGS, &r) < 0) die("KVM_SET_REGS");
}

static const struct mode *cur_mode;

static void vcpu_reset(struct vm *v, uint32_t iterations) {
    const struct mode *m = cur_mode;
    uint32_t dl = deadline_arg != UINT32_MAX ? deadline_arg : m->deadline;
    set_cpu(v->vcpu, CODE_GPA + (m->apic ? m->entry - g_apic : 0), iterations,
            m->apic == APIC_TIMER ? dl : m->apic == APIC_SELF ? vector_arg & 0xff : 0);
}

/* vCPU 1 (ipi modes): set up once, runs its loop for the whole process; what stops it is
 * reported by the main thread's watchdog. */
static char ap_error[200];
static volatile int ap_failed;

static void *ap_thread(void *arg) {
    struct vm *v = arg;
    prctl(PR_SET_NAME, "CPU 1/KVM");
    for (;;) {
        if (ioctl(v->vcpu1, KVM_RUN, 0) < 0) {
            if (errno == EINTR) continue;
            snprintf(ap_error, sizeof(ap_error), "KVM_RUN on vCPU 1: %s", strerror(errno));
            break;
        }
        uint32_t why = v->run1->exit_reason;
        if (why == KVM_EXIT_IO && v->run1->io.port == EXC_PORT)
            snprintf(ap_error, sizeof(ap_error), "guest exception vector %u on vCPU 1",
                     *((unsigned char *)v->run1 + v->run1->io.data_offset));
        else
            snprintf(ap_error, sizeof(ap_error), "unexpected exit %u (%s) on vCPU 1", why,
                     why < NNAMES ? exit_names[why] : "?");
        break;
    }
    ap_failed = 1;
    return NULL;
}

static void on_alarm(int sig) { (void)sig; }   /* only to make KVM_RUN return EINTR */

static void start_ap(struct vm *v) {
    set_cpu(v->vcpu1, CODE_GPA + (cur_mode->ap_entry - g_apic), 0, 0);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);   /* the watchdog's SIGALRM goes to vCPU 0's thread */
    pthread_t t;
    if (pthread_create(&t, NULL, ap_thread, v) != 0) fail("pthread_create for vCPU 1 failed");
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Ticks once a second while the guest runs, and only then: a tick while the helper waits on
 * stdin would end that read with EINTR. */
static void watchdog(int on) {
    static int installed;
    if (!installed) {
        struct sigaction sa = {.sa_handler = on_alarm};   /* no SA_RESTART: KVM_RUN returns EINTR */
        sigaction(SIGALRM, &sa, NULL);
        installed = 1;
    }
    struct itimerval it = {.it_interval = {on, 0}, .it_value = {on, 0}};
    setitimer(ITIMER_REAL, &it, NULL);
}

/* A line (or what came) from stdin; 0 at EOF. A stray signal does not end the wait. */
static ssize_t read_stdin(char *buf, size_t n) {
    ssize_t r;
    while ((r = read(0, buf, n)) < 0 && errno == EINTR) {}
    return r;
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
    volatile uint32_t *progress = (volatile uint32_t *)(v->mem + PROGRESS);
    uint32_t progress0 = *progress, seen = progress0, stuck = 0;
    if (cur_mode->apic) watchdog(1);
    uint64_t t0 = now_ns(), c0 = __rdtsc(), u0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (;;) {
        if (ioctl(v->vcpu, KVM_RUN, 0) < 0) {
            if (errno != EINTR) die("KVM_RUN");
            if (ap_failed) fail(ap_error);
            if (*progress != seen) seen = *progress, stuck = 0;
            else if (++stuck >= 5) {   /* the LAPIC modes' watchdog ticks once a second */
                char msg[200];
                if (cur_mode->apic == APIC_IPI && !v->mem[READY])
                    snprintf(msg, sizeof(msg), "vCPU 1 did not enable its LAPIC in 5 s (it never ran its code)");
                else if (cur_mode->apic == APIC_SELF)
                    snprintf(msg, sizeof(msg), "no ICR write completed in 5 s (%u of %u operations done)",
                             *progress - progress0, iterations);
                else
                    snprintf(msg, sizeof(msg), "no %s delivered to the guest in 5 s (%u of %u operations done)",
                             cur_mode->apic == APIC_IPI ? "IPI" : "timer interrupt", *progress - progress0,
                             iterations);
                fail(msg);
            }
            continue;
        }
        res->runs++;
        uint32_t why = v->run->exit_reason;
        res->exits[why < NNAMES ? why : NNAMES]++;
        if (why == KVM_EXIT_IO && v->run->io.port == DONE_PORT) break;
        if (why == KVM_EXIT_IO && v->run->io.port == EXC_PORT && cur_mode->apic) {
            char msg[200];
            snprintf(msg, sizeof(msg), "guest exception vector %u on vCPU 0 (an instruction of the loop failed)",
                     *((unsigned char *)v->run + v->run->io.data_offset));
            fail(msg);
        }
        if (why == KVM_EXIT_IO || why == KVM_EXIT_HLT || why == KVM_EXIT_MMIO) continue;
        printf("{\"error\": \"unexpected exit %u (%s) after %llu runs\"}\n", why,
               why < NNAMES ? exit_names[why] : "?", (unsigned long long)res->runs);
        exit(4);
    }
    res->cycles = __rdtsc() - c0;
    res->ns = now_ns() - t0;
    res->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - u0;   /* this thread only, user + sys */
    if (cur_mode->apic) watchdog(0);
    res->exits[KVM_EXIT_IO]--;   /* the done signal is not part of the loop */
    res->runs--;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The guest's own per-operation times of the last run (its buffer keeps the last 16384):
 * nearest-rank percentiles, rank = ceil(p * n / 100), as kvm-utils reports everywhere. */
static void print_op_times(struct vm *v, uint64_t iterations) {
    enum { SLOTS = 0x10000 / 4 };
    static uint32_t t[SLOTS];
    size_t n = iterations < SLOTS ? iterations : SLOTS;
    memcpy(t, v->mem + 0x10000, n * 4);
    qsort(t, n, 4, cmp_u32);
    size_t r50 = (50 * n + 99) / 100, r99 = (99 * n + 99) / 100;
    printf(", \"op_samples\": %zu, \"op_cycles_min\": %u, \"op_cycles_p50\": %u, \"op_cycles_p99\": %u, "
           "\"op_cycles_max\": %u", n, t[0], t[r50 - 1], t[r99 - 1], t[n - 1]);
}

static void print_result(struct vm *v, const struct mode *m, uint64_t iterations, const struct result *res, int khz) {
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
    printf("}");
    if (m->apic) print_op_times(v, iterations);
    printf("}\n");
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
        else if (!strcmp(argv[i], "--deadline-cycles") && i + 1 < argc) deadline_arg = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--vector") && i + 1 < argc) vector_arg = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--wait-stdin")) wait_stdin = 1;
        else if (!strcmp(argv[i], "--repeat")) repeat = wait_stdin = 1;
        else if (!name) name = argv[i];
        else count = argv[i];
    }
    if (!name || !count) {
        fprintf(stderr, "usage: %s [-name guest=NAME] [--target-cycles C] [--linger-ms MS] [--delay-ms MS] "
                "[--port P] [--deadline-cycles C] [--vector V] [--wait-stdin] [--repeat] MODE ITERATIONS\nmodes:",
                argv[0]);
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
    cur_mode = m;
    vm_create(&v, m);
    if (m->apic == APIC_IPI) start_ap(&v);
    if (delay_ms) usleep(delay_ms * 1000);   /* let a tracer attach to this vCPU thread first */
    char go[64];
    if (wait_stdin) {
        fprintf(stderr, "ready pid %d\n", getpid());
        if (read_stdin(go, sizeof(go)) <= 0) return 5;   /* stdin closed: the tracer gave up */
    }
    struct result res;
    run_once(&v, (uint32_t)iterations, &res);
    while (target && res.cycles < target && iterations * 2 <= 0xffffffffull) {
        iterations *= 2;
        run_once(&v, (uint32_t)iterations, &res);
    }
    int khz = ioctl(v.vcpu, KVM_GET_TSC_KHZ, 0);
    print_result(&v, m, iterations, &res, khz);
    if (linger_ms) usleep(linger_ms * 1000);   /* stay visible in /proc for tracers */
    while (wait_stdin && read_stdin(go, sizeof(go)) > 0) {
        if (!repeat) continue;
        run_once(&v, (uint32_t)iterations, &res);  /* same VM, same ITERATIONS, one result line per line */
        print_result(&v, m, iterations, &res, khz);
    }
    return 0;
}
