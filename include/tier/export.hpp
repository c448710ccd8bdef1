// TIER_EXPORT: marks what libtier.so exports. The project builds with hidden visibility, so
// only the public API (the classes and functions of include/tier/ marked with this) is part of
// the shared library's ABI; the wire codec, the connection and everything else linked into it
// stay internal and cannot be bound to by a program by accident.
#pragma once

#define TIER_EXPORT [[gnu::visibility("default")]]
