// Umbrella header for the VeloxQuant library.
#pragma once

#include "veloxquant/builder.h"
#include "veloxquant/cache.h"
#include "veloxquant/config.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"
#include "veloxquant/types.h"
#include "veloxquant/version.h"
