//! `rdmabench devices`: every device, port and non-zero GID, as a table or JSON.

use std::io::Write;

use crate::error::{Error, Result};
use crate::verbs::inventory::DeviceInfo;

pub fn print(devices: &[DeviceInfo], json: bool, out: &mut dyn Write) -> Result<()> {
    let io = |e: std::io::Error| Error::Environment(format!("cannot write: {e}"));
    if json {
        let text = serde_json::to_string_pretty(devices).map_err(|e| Error::Check(e.to_string()))?;
        return writeln!(out, "{text}").map_err(io);
    }
    for d in devices {
        writeln!(out, "{}  node_guid {}  sys_image_guid {}", d.name, d.node_guid, d.sys_image_guid).map_err(io)?;
        for p in &d.ports {
            let rate = p.rate_gbps.map_or("unknown".into(), |r| format!("{r} Gb/s"));
            writeln!(
                out,
                "  port {}  {} ({})  link {}  mtu {} (max {})  rate {}  lid {}  max_msg {} B",
                p.port,
                p.state,
                p.phys_state,
                p.link_layer.label(),
                p.active_mtu,
                p.max_mtu,
                rate,
                p.lid,
                p.max_msg_size
            )
            .map_err(io)?;
            writeln!(out, "    index  type    {:<40} netdev     state ipv4", "gid").map_err(io)?;
            for g in &p.gids {
                writeln!(
                    out,
                    "    {:>5}  {:<7} {:<40} {:<10} {:<5} {}",
                    g.index,
                    g.kind.label(),
                    g.gid.to_string(),
                    g.netdev.as_deref().unwrap_or("-"),
                    if g.netdev_up { "up" } else { "down" },
                    g.ipv4().map_or("-".into(), |a| a.to_string())
                )
                .map_err(io)?;
            }
        }
    }
    Ok(())
}
