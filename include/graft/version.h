/// @file
/// The library's version, set here and only here: CMakeLists.txt reads it for project(), which
/// stamps the libraries' SONAME, the CMake package and graft.pc.
#pragma once

/// Major version: a change breaks the API.
#define GRAFT_VERSION_MAJOR 0
/// Minor version: in 0.x releases a change may break the API too.
#define GRAFT_VERSION_MINOR 6
/// Patch version: fixes only.
#define GRAFT_VERSION_PATCH 0
/// The version as text, "major.minor.patch".
#define GRAFT_VERSION_STRING "0.6.0"
