# Where the system integration files go. Relative paths (the default) follow
# CMAKE_INSTALL_PREFIX, so `cmake --install build --prefix /tmp/x` stays in
# /tmp/x; a distribution build configured with CMAKE_INSTALL_PREFIX=/usr takes
# systemd's and bash-completion's own directories from pkg-config (absolute,
# under DESTDIR).
set(_hvt_unitdir "lib/systemd/system")
set(_hvt_completiondir "${CMAKE_INSTALL_DATAROOTDIR}/bash-completion/completions")
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  pkg_get_variable(_hvt_pc_unitdir systemd systemdsystemunitdir)
  if(_hvt_pc_unitdir)
    set(_hvt_unitdir "${_hvt_pc_unitdir}")
  endif()
  pkg_get_variable(_hvt_pc_completiondir bash-completion completionsdir)
  if(_hvt_pc_completiondir)
    set(_hvt_completiondir "${_hvt_pc_completiondir}")
  endif()
endif()
set(HVTRACE_SYSTEMD_UNITDIR "${_hvt_unitdir}" CACHE STRING "systemd system unit directory")
set(HVTRACE_BASH_COMPLETIONDIR "${_hvt_completiondir}" CACHE STRING "bash-completion completions directory")
# sysusers.d and tmpfiles.d live under PREFIX/lib (not LIBDIR: never multiarch).
set(HVTRACE_SYSUSERSDIR "lib/sysusers.d" CACHE STRING "sysusers.d directory")
set(HVTRACE_TMPFILESDIR "lib/tmpfiles.d" CACHE STRING "tmpfiles.d directory")
# The config lives in SYSCONFDIR/hvtrace (Debian passes /etc).
set(HVTRACE_CONFDIR "${CMAKE_INSTALL_SYSCONFDIR}/hvtrace" CACHE STRING "hvtraced.conf directory")
# initramfs-tools looks in /usr/share/initramfs-tools for packaged hooks.
set(HVTRACE_INITRAMFSDIR "${CMAKE_INSTALL_DATADIR}/initramfs-tools" CACHE STRING "initramfs-tools directory")
