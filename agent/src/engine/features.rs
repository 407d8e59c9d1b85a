//! What this kernel's BPF can do, probed once at start by creating maps and loading tiny
//! programs (as libbpf's `libbpf_probe_*` and bpftool's feature probe do), never guessed from
//! the version: each missing feature picks another implementation (twin programs, rodata
//! switches, retyped maps) or, where none exists, refuses that one part with a one-line reason.
use std::collections::BTreeMap;

use phaseprof_model::EventKind;

/// The minimum for anything at all: BTF (CO-RE relocations), ring buffers (5.8).
pub const CORE_MINIMUM: &str = "Linux 5.8 with BTF (/sys/kernel/btf/vmlinux)";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// /sys/kernel/btf/vmlinux: CO-RE needs it.
    pub btf: bool,
    /// BPF ring buffers (5.8): every event stream.
    pub ringbuf: bool,
    /// Task-local storage maps with bpf_get_current_task_btf (5.11); else hashes keyed by tid.
    pub task_storage: bool,
    /// Atomic OR and friends (5.12); else the fork program adds a target's bit once.
    pub atomic_or: bool,
    /// bpf_get_attach_cookie (5.15); else one program per phase id (native and Go entries), per
    /// Go scheduler point and per allocator kind; Go's allocation samples need it.
    pub attach_cookie: bool,
    /// bpf_task_pt_regs (5.15); else the registers at the top of the kernel stack.
    pub task_pt_regs: bool,
    /// uprobe_multi links with per-process filtering (6.6, the filter fixed in 6.10); else one
    /// uprobe per allocator function.
    pub uprobe_multi: bool,
    /// The scheduler's own per-task wait accounting in the kernel's BTF (`sched_info`'s
    /// run_delay and last_queued, and the run queue's clock through `se.cfs_rq`:
    /// CONFIG_SCHED_INFO and CONFIG_FAIR_GROUP_SCHED): a thread's wait for a CPU is read at its
    /// switch-in; else a sched_wakeup program marks when it became runnable.
    pub sched_info: bool,
}

impl KernelFeatures {
    /// Probes the running kernel (needs the privileges recording needs).
    pub fn probe() -> KernelFeatures {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        KernelFeatures {
            release,
            btf: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            ringbuf: probe::map_type(libbpf_sys::BPF_MAP_TYPE_RINGBUF),
            task_storage: probe::map_type(libbpf_sys::BPF_MAP_TYPE_TASK_STORAGE)
                && probe::helper(
                    libbpf_sys::BPF_PROG_TYPE_KPROBE,
                    libbpf_sys::BPF_FUNC_get_current_task_btf,
                ),
            atomic_or: probe::atomic_or(),
            attach_cookie: probe::helper(
                libbpf_sys::BPF_PROG_TYPE_KPROBE,
                libbpf_sys::BPF_FUNC_get_attach_cookie,
            ),
            task_pt_regs: probe::helper(
                libbpf_sys::BPF_PROG_TYPE_KPROBE,
                libbpf_sys::BPF_FUNC_task_pt_regs,
            ),
            uprobe_multi: probe::uprobe_multi(),
            sched_info: probe::kernel_fields(&[
                ("sched_info", "run_delay"),
                ("sched_info", "last_queued"),
                ("sched_entity", "cfs_rq"),
                ("cfs_rq", "rq"),
                ("rq", "clock"),
            ]),
        }
    }

    /// Everything present (what the programs assume by default).
    pub fn all(release: &str) -> KernelFeatures {
        KernelFeatures {
            release: release.to_string(),
            btf: true,
            ringbuf: true,
            task_storage: true,
            atomic_or: true,
            attach_cookie: true,
            task_pt_regs: true,
            uprobe_multi: true,
            sched_info: true,
        }
    }

    /// The features a kernel may lack, each with a fallback, by name: the one list that
    /// `without` and `summary` go by.
    fn optional(&mut self) -> [(&'static str, &mut bool); 6] {
        [
            ("task_storage", &mut self.task_storage),
            ("atomic_or", &mut self.atomic_or),
            ("attach_cookie", &mut self.attach_cookie),
            ("task_pt_regs", &mut self.task_pt_regs),
            ("uprobe_multi", &mut self.uprobe_multi),
            ("sched_info", &mut self.sched_info),
        ]
    }

    /// These features taken as missing (`PHASEPROF_KERNEL_WITHOUT=sched_info,task_storage`):
    /// a newer kernel runs the fallbacks an older one needs, to test them.
    pub fn without(mut self, names: &str) -> Result<KernelFeatures, String> {
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let mut optional = self.optional();
            match optional.iter_mut().find(|(n, _)| *n == name) {
                Some((_, flag)) => **flag = false,
                None => {
                    let known: Vec<&str> = optional.iter().map(|(n, _)| *n).collect();
                    return Err(format!(
                        "PHASEPROF_KERNEL_WITHOUT: unknown feature `{name}` (known: {})",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(self)
    }

    /// Why this process may not use BPF at all (its privileges, not the kernel), if so.
    pub fn refused() -> Option<String> {
        probe::refused()
    }

    /// Why nothing can be recorded on this kernel, if so.
    pub fn core_missing(&self) -> Option<String> {
        let mut missing = Vec::new();
        if !self.btf {
            missing.push("kernel BTF (CONFIG_DEBUG_INFO_BTF)");
        }
        if !self.ringbuf {
            missing.push("BPF ring buffers (Linux 5.8)");
        }
        if missing.is_empty() {
            return None;
        }
        Some(format!(
            "this kernel ({}) lacks {}: phaseprof needs {CORE_MINIMUM}",
            self.release,
            missing.join(" and ")
        ))
    }

    /// Why `what` cannot be recorded on this kernel, if it cannot (a one-line reason).
    pub fn cannot(&self, what: Needs) -> Option<String> {
        let lacks = match what {
            Needs::GoAlloc if !self.attach_cookie => "bpf_get_attach_cookie (Linux 5.15)",
            _ => return None,
        };
        Some(format!(
            "{}: needs {lacks}, which this kernel ({}) lacks",
            what.name(),
            self.release
        ))
    }

    /// Each feature this kernel lacks that the recording would use, with what is used instead:
    /// `(feature, explanation)`. Printed at start, one line each, and kept in the recording.
    pub fn fallbacks(&self, events: &[EventKind], phases: bool) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !self.task_storage {
            out.push((
                "task_storage",
                "task-local storage needs Linux 5.11; using per-thread hash maps".to_string(),
            ));
        }
        if !self.atomic_or {
            out.push((
                "atomic_or",
                "BPF atomic OR needs Linux 5.12; following forks with a plain add".to_string(),
            ));
        }
        if !self.task_pt_regs {
            out.push((
                "task_pt_regs",
                "bpf_task_pt_regs needs Linux 5.15; reading user registers off the kernel stack"
                    .to_string(),
            ));
        }
        if (phases || events.contains(&EventKind::Alloc)) && !self.attach_cookie {
            out.push((
                "attach_cookie",
                "attach cookies need Linux 5.15; one program per phase, Go scheduler point and \
                 allocator kind"
                    .to_string(),
            ));
        }
        if (phases || events.contains(&EventKind::Alloc)) && !self.uprobe_multi {
            out.push((
                "uprobe_multi",
                "uprobe_multi links need Linux 6.6 (per-process filtering: 6.10); allocator and \
                 phase probes one link each (a phase budget's detaches take a grace period each)"
                    .to_string(),
            ));
        }
        if events.contains(&EventKind::Offcpu) && !self.sched_info {
            out.push((
                "sched_info",
                "no scheduler wait accounting in the kernel's BTF (CONFIG_SCHED_INFO, \
                 CONFIG_FAIR_GROUP_SCHED); a sched_wakeup program marks when threads become \
                 runnable"
                    .to_string(),
            ));
        }
        out
    }

    /// What `--version` says of this kernel: each feature, and what stands in for those it
    /// lacks (probed: as root only, since the probes load programs).
    pub fn version_text() -> String {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return "kernel features: not probed (the probes load BPF programs: run as root)"
                .into();
        }
        if let Some(why) = KernelFeatures::refused() {
            return format!("kernel features: not probed: {why}");
        }
        let k = KernelFeatures::probe();
        let summary = k.summary(&EventKind::ALL, true);
        let flags: Vec<String> = (summary.iter())
            .map(|(name, v)| format!("{name} {}", if v == "yes" { "yes" } else { "no" }))
            .collect();
        let mut text = format!("kernel {}: {}", k.release, flags.join(", "));
        for (name, v) in summary.iter().filter(|(_, v)| v.starts_with("no: ")) {
            text += &format!("\n  {name}: {}", &v["no: ".len()..]);
        }
        text
    }

    /// Every feature with `yes` or what replaced it: the recording's `kernel_features`.
    pub fn summary(&self, events: &[EventKind], phases: bool) -> BTreeMap<String, String> {
        let mut copy = self.clone();
        let optional = copy.optional().map(|(name, flag)| (name, *flag));
        let mut all: BTreeMap<String, String> = [("btf", self.btf), ("ringbuf", self.ringbuf)]
            .into_iter()
            .chain(optional)
            .map(|(k, v)| (k.to_string(), if v { "yes" } else { "no" }.to_string()))
            .collect();
        for (k, why) in self.fallbacks(events, phases) {
            all.insert(k.to_string(), format!("no: {why}"));
        }
        all
    }
}

/// Parts of a recording that need more than the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Go's heap-sample hook: the address of its sampling rate travels in the cookie.
    GoAlloc,
}

impl Needs {
    fn name(self) -> &'static str {
        match self {
            Needs::GoAlloc => "allocations in Go code",
        }
    }
}

/// The probes themselves: each creates or loads one tiny thing and closes it.
mod probe {
    use std::os::fd::{FromRawFd, OwnedFd};

    /// Why this process may not use bpf() at all, if so: an array map, which every kernel
    /// with BPF creates, refused with EPERM (no CAP_BPF, or a seccomp filter: a container's).
    pub fn refused() -> Option<String> {
        // SAFETY: a NULL name and opts are allowed; the descriptor is closed below.
        let fd = unsafe {
            libbpf_sys::bpf_map_create(
                libbpf_sys::BPF_MAP_TYPE_ARRAY,
                std::ptr::null(),
                4,
                4,
                1,
                std::ptr::null(),
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor bpf_map_create just returned is ours.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            return None;
        }
        (-fd == libc::EPERM).then(|| {
            "bpf() was refused (EPERM): phaseprof needs root, or CAP_BPF, CAP_PERFMON, \
             CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH; in a container also a seccomp profile that \
             allows bpf() and perf_event_open() to them (Podman before 4.4 allows them to \
             CAP_SYS_ADMIN only: see deploy/README.md)"
                .to_string()
        })
    }

    /// Whether this kernel creates maps of `ty`.
    pub fn map_type(ty: libbpf_sys::bpf_map_type) -> bool {
        // SAFETY: a NULL opts is allowed; libbpf creates and closes its own probe map.
        unsafe { libbpf_sys::libbpf_probe_bpf_map_type(ty, std::ptr::null()) == 1 }
    }

    /// Whether programs of `prog` may call `helper`.
    pub fn helper(prog: libbpf_sys::bpf_prog_type, helper: libbpf_sys::bpf_func_id) -> bool {
        // SAFETY: a NULL opts is allowed; libbpf loads and closes its own probe program.
        unsafe { libbpf_sys::libbpf_probe_bpf_helper(prog, helper, std::ptr::null()) == 1 }
    }

    fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> libbpf_sys::bpf_insn {
        let mut i = libbpf_sys::bpf_insn {
            code,
            off,
            imm,
            // SAFETY: bpf_insn is plain integers (registers in a bitfield): zeros are valid.
            ..unsafe { std::mem::zeroed() }
        };
        i.set_dst_reg(dst);
        i.set_src_reg(src);
        i
    }

    /// `r0 = 0; exit`.
    fn return_zero() -> [libbpf_sys::bpf_insn; 2] {
        [insn(0xb7, 0, 0, 0, 0), insn(0x95, 0, 0, 0, 0)]
    }

    fn load(
        ty: libbpf_sys::bpf_prog_type,
        insns: &[libbpf_sys::bpf_insn],
        expected_attach_type: libbpf_sys::bpf_attach_type,
    ) -> Option<OwnedFd> {
        let mut opts = libbpf_sys::bpf_prog_load_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_prog_load_opts>() as _,
            expected_attach_type,
            ..Default::default()
        };
        // SAFETY: insns and opts outlive the call; the license is NUL-terminated.
        let fd = unsafe {
            libbpf_sys::bpf_prog_load(
                ty,
                std::ptr::null(),
                c"GPL".as_ptr(),
                insns.as_ptr(),
                insns.len() as _,
                &mut opts,
            )
        };
        // SAFETY: a descriptor bpf_prog_load just returned is ours.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Whether the verifier takes an atomic OR (BPF_ATOMIC with an op, Linux 5.12; older
    /// kernels refuse the instruction as "BPF_STX uses reserved fields").
    pub fn atomic_or() -> bool {
        const BPF_OR: i32 = 0x40;
        let insns = [
            insn(0xb7, 1, 0, 0, 0),        // r1 = 0
            insn(0x7b, 10, 1, -8, 0),      // *(u64 *)(r10 - 8) = r1
            insn(0xb7, 1, 0, 0, 1),        // r1 = 1
            insn(0xdb, 10, 1, -8, BPF_OR), // lock *(u64 *)(r10 - 8) |= r1
            insn(0xb7, 0, 0, 0, 0),        // r0 = 0
            insn(0x95, 0, 0, 0, 0),        // exit
        ];
        load(libbpf_sys::BPF_PROG_TYPE_SOCKET_FILTER, &insns, 0).is_some()
    }

    /// Whether the kernel's BTF has every `(struct, field)` of `fields` (CO-RE reads them).
    pub fn kernel_fields(fields: &[(&str, &str)]) -> bool {
        use libbpf_rs::btf::{types::Struct, Btf};
        let Ok(btf) = Btf::from_vmlinux() else {
            return false;
        };
        fields.iter().all(|(ty, field)| {
            btf.type_by_name::<Struct<'_>>(ty).is_some_and(|s| {
                s.iter().any(|m| {
                    m.name
                        .is_some_and(|n| n.as_encoded_bytes() == field.as_bytes())
                })
            })
        })
    }

    /// Whether uprobe_multi links exist and filter by process (libbpf's own probe: on "/" the
    /// link fails with EBADF where they exist; with pid -1 it fails earlier, with EINVAL, once
    /// the filter is per process, not per thread).
    pub fn uprobe_multi() -> bool {
        let Some(prog) = load(
            libbpf_sys::BPF_PROG_TYPE_KPROBE,
            &return_zero(),
            libbpf_sys::BPF_TRACE_UPROBE_MULTI,
        ) else {
            return false;
        };
        let link_err = |pid: i32| -> i32 {
            let offset: std::os::raw::c_ulong = 0;
            let mut opts = libbpf_sys::bpf_link_create_opts {
                sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
                ..Default::default()
            };
            opts.__bindgen_anon_1.uprobe_multi.path = c"/".as_ptr();
            opts.__bindgen_anon_1.uprobe_multi.offsets = &offset;
            opts.__bindgen_anon_1.uprobe_multi.cnt = 1;
            opts.__bindgen_anon_1.uprobe_multi.pid = pid as u32;
            use std::os::fd::AsRawFd;
            // SAFETY: opts and the strings and offsets it points to outlive the call.
            let fd = unsafe {
                libbpf_sys::bpf_link_create(
                    prog.as_raw_fd(),
                    -1,
                    libbpf_sys::BPF_TRACE_UPROBE_MULTI,
                    &opts,
                )
            };
            if fd >= 0 {
                // SAFETY: a descriptor bpf_link_create just returned is ours to close.
                unsafe { libc::close(fd) };
                return 0;
            }
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        };
        link_err(0) == libc::EBADF && link_err(-1) == libc::EINVAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the one-line reasons: a kernel like 5.10 (no cookies, no task storage) refuses
    // Go allocations and says which fallbacks it uses; a complete kernel has none;
    // a kernel without ring buffers is refused with the minimum.
    #[test]
    fn reasons_name_the_missing_feature_and_the_minimum() {
        let old = KernelFeatures {
            task_storage: false,
            atomic_or: false,
            attach_cookie: false,
            task_pt_regs: false,
            uprobe_multi: false,
            sched_info: false,
            ..KernelFeatures::all("5.10.0-32-amd64")
        };
        assert_eq!(
            old.cannot(Needs::GoAlloc).unwrap(),
            "allocations in Go code: needs bpf_get_attach_cookie (Linux 5.15), which this \
             kernel (5.10.0-32-amd64) lacks"
        );
        let lines = old.fallbacks(&[EventKind::Cpu], true);
        let names: Vec<_> = lines.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            [
                "task_storage",
                "atomic_or",
                "task_pt_regs",
                "attach_cookie",
                "uprobe_multi"
            ]
        );
        assert_eq!(old.summary(&[], false)["uprobe_multi"], "no");
        // Off-CPU time says how it reads the wait for a CPU there.
        let offcpu = old.fallbacks(&[EventKind::Offcpu], false);
        assert!(offcpu
            .iter()
            .any(|(k, why)| *k == "sched_info" && why.contains("sched_wakeup")));
        // The fallbacks can be forced on a newer kernel, by name only.
        let forced = KernelFeatures::all("6.18.0")
            .without("sched_info, task_storage")
            .unwrap();
        assert!(!forced.sched_info && !forced.task_storage && forced.atomic_or);
        let err = KernelFeatures::all("6.18.0")
            .without("bpf_loop")
            .unwrap_err();
        assert!(err.contains("unknown feature `bpf_loop`"), "{err}");
        assert!(err.ends_with("uprobe_multi, sched_info)"), "{err}");
        let summary = forced.summary(&[EventKind::Offcpu], false);
        assert_eq!(summary.len(), 8, "{summary:?}");
        assert_eq!(
            (summary["btf"].as_str(), summary["atomic_or"].as_str()),
            ("yes", "yes")
        );
        assert!(summary["sched_info"].starts_with("no: "), "{summary:?}");
        let new = KernelFeatures::all("6.18.0");
        assert!(new.fallbacks(&[EventKind::Alloc], true).is_empty());
        assert!(new.cannot(Needs::GoAlloc).is_none());
        assert!(new.core_missing().is_none());
        let no_ring = KernelFeatures {
            ringbuf: false,
            ..KernelFeatures::all("5.4.0")
        };
        assert_eq!(
            no_ring.core_missing().unwrap(),
            "this kernel (5.4.0) lacks BPF ring buffers (Linux 5.8): phaseprof needs Linux 5.8 \
             with BTF (/sys/kernel/btf/vmlinux)"
        );
    }
}
