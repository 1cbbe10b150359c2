//! The images of `image_url` content parts: `data:` URLs (base64), and `http(s)` URLs only
//! where the server was started with `--allow-image-urls` (fetching makes the server a
//! client of any address a request names). Other schemes (`file:`) are refused.

use base64::Engine as _;
use kiln::vision::image::MAX_FILE_BYTES;
use kiln::vision::RgbImage;

/// The image at `url`, decoded; the error says why not, for a 400.
pub fn load(url: &str, allow_remote: bool) -> Result<RgbImage, String> {
    let bytes = if let Some(data) = url.strip_prefix("data:") {
        let (kind, payload) = data.split_once(',').ok_or("a data: URL without a comma")?;
        if !kind.ends_with(";base64") {
            return Err("a data: URL must be base64 (data:image/png;base64,...)".into());
        }
        base64::engine::general_purpose::STANDARD
            .decode(payload.trim())
            .map_err(|e| format!("bad base64: {e}"))?
    } else if url.starts_with("http://") || url.starts_with("https://") {
        if !allow_remote {
            return Err(
                "remote image URLs are refused (the server was not started with --allow-image-urls)".into()
            );
        }
        fetch(url)?
    } else {
        return Err("an image URL must be a data: URL (or http(s) with --allow-image-urls)".into());
    };
    RgbImage::decode(&bytes).map_err(|e| e.to_string())
}

fn fetch(url: &str) -> Result<Vec<u8>, String> {
    let mut resp = ureq::get(url).call().map_err(|e| format!("fetching {url}: {e}"))?;
    resp.body_mut()
        .with_config()
        .limit(MAX_FILE_BYTES)
        .read_to_vec()
        .map_err(|e| format!("reading {url}: {e}"))
}
