//! `phaseprof export`: folded stacks, pprof, or an SVG flamegraph of one event kind.
use std::io::Write;

use anyhow::Result;
use phaseprof_flamegraphs::{write_folded, write_svg, Selection};
use phaseprof_model::{EventKind, Profile};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExportFormat {
    Folded,
    Pprof,
    Svg,
    Speedscope,
    Otlp,
}

#[derive(Clone, Debug)]
pub struct ExportOptions {
    pub format: ExportFormat,
    pub event: EventKind,
    pub phase: Option<u32>,
    /// Folded and SVG: one tree per process or thread under a root frame naming it (pprof
    /// samples always carry pid, tid and thread labels instead).
    pub group: Option<phaseprof_model::threads::GroupBy>,
}

pub fn export(profile: &Profile, opts: &ExportOptions, mut out: impl Write) -> Result<()> {
    let sel = Selection {
        group: opts.group,
        kind: opts.event,
        phase: opts.phase,
    };
    match opts.format {
        ExportFormat::Folded => write_folded(profile, &sel, &mut out)?,
        ExportFormat::Svg => write_svg(profile, &sel, &mut out)?,
        ExportFormat::Speedscope | ExportFormat::Pprof | ExportFormat::Otlp => {
            if !profile.recorded(opts.event) {
                anyhow::bail!(phaseprof_flamegraphs::FlamegraphError::NotRecorded(
                    opts.event
                ));
            }
            let (event, phase) = (opts.event, opts.phase);
            match opts.format {
                ExportFormat::Speedscope => {
                    crate::speedscope::write_speedscope(profile, event, phase, &mut out)?
                }
                ExportFormat::Otlp => crate::otlp::write_otlp(profile, event, phase, &mut out)?,
                _ => crate::pprof::write_pprof(profile, event, phase, &mut out)?,
            }
        }
    }
    out.flush()?;
    Ok(())
}
