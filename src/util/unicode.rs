//! Which characters are invisible: every default-ignorable code point (Unicode's
//! `Default_Ignorable_Code_Point`). The SILP sanitiser strips them; JSON writers escape them so
//! that they survive a later sanitised read.

use unicode_security::confusable_detection::skeleton;

/// True for an invisible character: a default-ignorable code point (which includes
/// every bidi control).
///
/// UTS #39 defines the skeleton of a string as its NFD with every default-ignorable code point
/// removed, then mapped through the confusables table; no default-ignorable code point has a
/// canonical decomposition and no confusable maps to nothing, so the skeleton of one character
/// is empty exactly when the character is default-ignorable (a unit test checks this against
/// every code point). unicode-security keeps that table private; this reads it through the
/// public skeleton.
pub fn is_invisible(c: char) -> bool {
    // No default-ignorable code point lies below the soft hyphen: ASCII and Latin-1 letters
    // take no table look-up.
    if c < '\u{AD}' {
        return false;
    }
    let mut buf = [0u8; 4];
    skeleton(c.encode_utf8(&mut buf)).next().is_none()
}
