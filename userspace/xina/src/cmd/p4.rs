//! `xina p4`: the P4 twin's control-plane state, and the shared test vectors
//! expanded for the `BMv2` runner (`p4/run_vectors.py`).

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{Context as _, bail};
use xina::{
    config::parse_mac,
    p4::{Program, vectors},
};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the P4 table entries, multicast groups and register
    /// initialisation for the jobs of a configuration file.
    Emit(EmitArgs),
    /// Expand the test vectors into frames and commands for the `BMv2` runner.
    Vectors(VectorArgs),
}

#[derive(Debug, Clone, Copy, Default, clap::ValueEnum)]
pub enum Format {
    /// `simple_switch_CLI` commands.
    #[default]
    Cli,
    /// P4Runtime-style JSON.
    Json,
}

#[derive(Debug, clap::Args)]
pub struct EmitArgs {
    /// The switch configuration file (TOML), as `xina run` reads it.
    #[arg(short, long)]
    config: PathBuf,
    /// The MAC address of a switch port, `NAME=aa:bb:cc:dd:ee:ff`; ports
    /// not given are looked up on this host.
    #[arg(long = "port-mac", value_name = "NAME=MAC")]
    port_macs: Vec<String>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Debug, clap::Args)]
pub struct VectorArgs {
    /// The directory of vector files.
    #[arg(long, default_value = "p4/vectors")]
    dir: PathBuf,
}

pub fn run(command: &Command) -> anyhow::Result<()> {
    match command {
        Command::Emit(args) => emit(args),
        Command::Vectors(args) => expand(args),
    }
}

fn emit(args: &EmitArgs) -> anyhow::Result<()> {
    let config = super::load_config(&args.config)?;
    let mut macs = BTreeMap::new();
    for given in &args.port_macs {
        let (name, mac) = given
            .split_once('=')
            .with_context(|| format!("--port-mac {given}: expected NAME=aa:bb:cc:dd:ee:ff"))?;
        let Some(mac) = parse_mac(mac) else {
            bail!("--port-mac {given}: {mac:?} is not a MAC address");
        };
        if !config.switch.ports.iter().any(|p| p == name) {
            bail!("--port-mac {given}: {name} is not one of switch.ports");
        }
        macs.insert(name.to_owned(), mac);
    }
    for port in &config.switch.ports {
        if !macs.contains_key(port)
            && let Ok(mac) = xina::netdev::mac(port)
        {
            macs.insert(port.clone(), mac);
        }
    }
    let program =
        Program::build(&config, &macs).with_context(|| format!("{}", args.config.display()))?;
    match args.format {
        Format::Cli => print!("{}", program.cli()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&program.p4runtime())?),
    }
    Ok(())
}

fn expand(args: &VectorArgs) -> anyhow::Result<()> {
    let all = vectors::load_dir(&args.dir)?;
    let mut out = Vec::with_capacity(all.len());
    for v in &all {
        out.push(v.to_p4_json().with_context(|| v.name.clone())?);
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({ "vectors": out }))?
    );
    Ok(())
}
