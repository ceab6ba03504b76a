// Package vmtest boots a stock Debian kernel under QEMU with a test program
// as its /init, so code that needs kernel features this machine lacks (IPVS;
// loading modules) runs against a real kernel.
//
// The pieces, all on the host:
//
//   - FetchKernel: `apt-get download linux-image-6.1.*-cloud-amd64` (the
//     newest the apt lists know) and `dpkg-deb -x` it into a cache
//     directory outside the repository (CacheDir), once.
//   - Kernel.Modules: the modules a list of names needs, in load order,
//     from each module's .modinfo (depends=, softdep= pre:), since an
//     unpacked kernel package has no modules.dep; built-in ones are
//     skipped, .ko.xz/.ko.zst are decompressed with the xz/zstd tools.
//   - Initramfs: a cpio "newc" archive written directly, /dev/console
//     included; AddHostFile copies a host binary with every path component
//     (merged-/usr symlinks too), and HostBinary adds its shared libraries
//     (ldd) so dynamically linked tools (iptables-legacy, ipset) run inside.
//   - Boot: `qemu-system-x86_64 -accel tcg -nic none -nographic -no-reboot`
//     (-accel kvm hangs on the machines this runs on), the serial console
//     copied to a writer and returned.
//   - ParseResults: the guest prints "VMTEST PASS name", "VMTEST FAIL name:
//     why", "VMTEST NOTE ..." and finally "VMTEST DONE".
//
// The guest side: a test program is the VM's /init, and its main is
// Guest.Run with its scenario (kernelmodes/ipvs/vmguest, bench/ipvsguest,
// internal/e2e/soakguest): it refuses to run but as PID 1, mounts /proc and
// /sys, loads the modules listed in /modules/order with finit_module, runs
// the scenario with a Reporter on the console and powers off. InitNode and
// AddGuestHost build the guests' topology: the initial namespace is the
// node, each other host a namespace behind a CNI-ptp-shaped veth.
package vmtest
