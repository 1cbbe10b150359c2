//! Images in: vision encoders (a ViT and a projector) from mmproj GGUF files, as llama.cpp's
//! `tools/mtmd` runs them. An image is decoded ([`image`]), preprocessed as its family does
//! ([`preprocess`]: resize with Pillow's filters in fixed point, tiling, normalization) and
//! encoded into rows of the language model's embedding width ([`encoder`]) and placed in the
//! prompt between its family's marker tokens ([`prompt`]).

pub mod config;
pub mod encoder;
pub mod image;
mod ops;
pub mod preprocess;
pub mod prompt;
mod resize;
pub mod synth;

pub use config::{ClipConfig, Projector};
pub use encoder::VisionEncoder;
pub use image::RgbImage;
pub use preprocess::{preprocess, Preprocessed, Tile};
pub use prompt::{encode_image, EncodedImage, ImageRows, MEDIA_MARKER};
