//! Generates the gRPC code and the file descriptor set used by server reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = ["ironguard/v1/filter.proto", "ironguard/v1/inspection.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("ironguard_descriptor.bin"))
        .compile_protos(&protos, &["."])?;
    Ok(())
}
